"""Per-backend tuning as typed pydantic models (SWE-ReX style configs).

Each backend has one model with ``extra="forbid"`` and a ``type`` discriminator, so a
config read from a file or a request parses to the right class::

    from pydantic import TypeAdapter
    cfg = TypeAdapter(BackendConfig).validate_python({"type": "microvm", "boot_timeout_s": 60})

The ``ROLLBOX_*`` environment variables that tuned backends before stay as overrides:
:func:`config_for` starts from the model (or its defaults) and applies those that are set.
A backend instance gets its config with ``get_backend(name, home, config=...)``; without
one it uses :func:`config_for` (see :attr:`rollbox.backends.base.Backend.config`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from rollbox.errors import InvalidInputError


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class NamespaceConfig(_Config):
    """Tuning of the ``namespace`` backend (bubblewrap); it has no knobs yet."""

    type: Literal["namespace"] = "namespace"
    """Discriminator: the backend this config is for."""


class GVisorConfig(_Config):
    """Tuning of the ``gvisor`` backend (runsc); it has no knobs yet."""

    type: Literal["gvisor"] = "gvisor"
    """Discriminator: the backend this config is for."""


class MicroVMConfig(_Config):
    """Tuning of the ``microvm`` backend (QEMU ``-M microvm``)."""

    type: Literal["microvm"] = "microvm"
    """Discriminator: the backend this config is for."""
    boot_timeout_s: float = Field(120.0, gt=0)
    """Seconds a guest may take to boot (or restore) until its agent answers
    (env ``ROLLBOX_MICROVM_BOOT_TIMEOUT``)."""
    boot_snapshots: bool = True
    """Create sandboxes by restoring a per-baseline boot snapshot instead of booting
    (env ``ROLLBOX_MICROVM_BOOT_SNAPSHOTS=0`` turns it off)."""
    split_memory: bool = True
    """Store memory snapshots as a copy-on-write RAM image + device state, mapped lazily on
    restore, instead of one stream (env ``ROLLBOX_MICROVM_SPLIT_MEMORY=0`` turns it off)."""
    accel: Literal["auto", "kvm", "tcg"] = "auto"
    """Accelerator: ``auto`` uses KVM only where a probe guest boots under it, else TCG
    (env ``ROLLBOX_MICROVM_ACCEL=kvm|tcg``)."""
    kvm_device: str = "/dev/kvm"
    """The KVM device the probe checks (env ``ROLLBOX_MICROVM_KVM_DEVICE``)."""
    probe_timeout_s: float = Field(4.0, gt=0)
    """Seconds the KVM probe guest may take to boot (env ``ROLLBOX_MICROVM_PROBE_TIMEOUT``)."""
    tb_mb: int = Field(32, ge=1)
    """TCG translation cache per VM in MiB: 16 trades speed for density, 8 is 3x slower
    (env ``ROLLBOX_MICROVM_TB_MB``)."""
    aslr: bool = False
    """Keep guest ASLR on under TCG (off by default: TCG re-translates every process's code
    at fresh addresses, ~4x slower execs; the VM is the boundary) (env
    ``ROLLBOX_MICROVM_ASLR=1``)."""


BackendConfig = Annotated[
    NamespaceConfig | GVisorConfig | MicroVMConfig, Field(discriminator="type")
]
"""Any built-in backend's config, parsed by its ``type``."""

_ADAPTER: TypeAdapter[NamespaceConfig | GVisorConfig | MicroVMConfig] = TypeAdapter(BackendConfig)


def _flag(value: str) -> bool:
    return value != "0"


def _on(value: str) -> bool:
    return value == "1"


def _accel(value: str) -> str:
    return value if value in ("kvm", "tcg") else "auto"  # as the probe always read it


# (backend, field) -> (environment variable, parser of its text)
ENV_OVERRIDES: dict[str, dict[str, tuple[str, Callable[[str], Any]]]] = {
    "microvm": {
        "boot_timeout_s": ("ROLLBOX_MICROVM_BOOT_TIMEOUT", float),
        "boot_snapshots": ("ROLLBOX_MICROVM_BOOT_SNAPSHOTS", _flag),
        "split_memory": ("ROLLBOX_MICROVM_SPLIT_MEMORY", _flag),
        "accel": ("ROLLBOX_MICROVM_ACCEL", _accel),
        "kvm_device": ("ROLLBOX_MICROVM_KVM_DEVICE", str),
        "probe_timeout_s": ("ROLLBOX_MICROVM_PROBE_TIMEOUT", float),
        "tb_mb": ("ROLLBOX_MICROVM_TB_MB", int),
        "aslr": ("ROLLBOX_MICROVM_ASLR", _on),
    },
}
"""The environment variables that override config fields, per backend."""


def parse_config(data: Mapping[str, Any]) -> BackendConfig:
    """A config from a mapping with a ``type`` key (e.g. a TOML/JSON table).

    Raises:
        InvalidInputError: unknown ``type``, unknown field or bad value (one line).
    """
    try:
        return _ADAPTER.validate_python(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        raise InvalidInputError(
            f"bad backend config {where}: {first['msg']}",
            hint="see rollbox.backends.config for the fields of each backend",
        ) from None


def config_for(
    name: str,
    config: BackendConfig | None = None,
    environ: Mapping[str, str] | None = None,
) -> BackendConfig:
    """The config of backend ``name``: ``config`` (default: its defaults) with the
    environment overrides that are set applied.

    Raises:
        InvalidInputError: ``config`` is for another backend, ``name`` is a backend from
            outside rollbox (it has no model here: it overrides ``Backend.config`` with its
            own), or an override is malformed.
    """
    env = os.environ if environ is None else environ
    if config is None:
        if name not in _DEFAULTS:
            raise InvalidInputError(
                f"backend {name!r} has no config model in rollbox.backends.config",
                hint="a backend from another package overrides Backend.config",
            )
        config = parse_config({"type": name})
    elif config.type != name:
        raise InvalidInputError(f"a {config.type!r} config was given to backend {name!r}")
    updates: dict[str, Any] = {}
    for field, (var, parse) in ENV_OVERRIDES.get(name, {}).items():
        text = env.get(var)
        if text is None:
            continue
        try:
            updates[field] = parse(text)
        except ValueError:
            raise InvalidInputError(f"bad {var}={text!r}", hint="see its config field") from None
    if not updates:
        return config
    return parse_config({**config.model_dump(), **updates})


_DEFAULTS = ("namespace", "gvisor", "microvm")
