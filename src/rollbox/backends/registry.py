"""Backends registered by name, imported lazily (Harbor's environment factory).

Two ways in, one table:

* the entry-point group ``rollbox.backends`` (``name = "package.module:Class"``): how the
  three built-ins are declared (rollbox's own ``pyproject.toml``) and how an outside
  package adds one — its module is imported only when the backend is asked for, so a host
  without QEMU can still use ``namespace``;
* the :func:`register_backend` class decorator, for a backend defined in the running
  program (it also checks a class loaded through an entry point).

A missing tool surfaces from :meth:`Backend.prepare` as a ``BackendUnavailableError``
naming the Debian package to install.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from pathlib import Path
from typing import TypeVar

from rollbox.backends.base import Backend
from rollbox.backends.config import BackendConfig
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError, UnknownBackendError

GROUP = "rollbox.backends"
"""The entry-point group backends are declared in."""

BUILTINS: dict[str, str] = {
    "namespace": "rollbox.backends.namespace:NamespaceBackend",
    "gvisor": "rollbox.backends.gvisor:GVisorBackend",
    "microvm": "rollbox.backends.microvm:MicroVMBackend",
}
"""rollbox's own entry points, as declared in its ``pyproject.toml``; used as they are when
the installed metadata is older than the sources (an editable install not re-run)."""

B = TypeVar("B", bound=type[Backend])

_REGISTERED: dict[str, type[Backend]] = {}
_LOCK = threading.Lock()


def register_backend(cls: B) -> B:
    """Class decorator: make ``cls`` available as backend ``cls.name``.

    Raises:
        TypeError: ``cls`` is not a :class:`Backend` with a ``name`` and ``capabilities``.
        ValueError: another class is registered under that name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"{cls!r} is not a rollbox Backend subclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or getattr(cls, "capabilities", None) is None:
        raise TypeError(f"backend class {cls.__qualname__} needs a name and capabilities")
    with _LOCK:
        have = _REGISTERED.get(name)
        if have is not None and have is not cls:
            raise ValueError(
                f"backend {name!r} is already registered by {have.__module__}.{have.__qualname__}"
            )
        _REGISTERED[name] = cls
    return cls


def _entry_points() -> dict[str, str]:
    """name -> ``module:attr`` of every declared backend (built-ins first)."""
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=GROUP)}
    return {**BUILTINS, **found}


def names() -> list[str]:
    """Registered backend names: the built-ins, then outside ones (entry points or
    :func:`register_backend`)."""
    out = list(_entry_points())
    return out + [n for n in list(_REGISTERED) if n not in out]


def backend_class(name: str) -> type[Backend]:
    """The class registered under ``name`` (its module imported on first use).

    Raises:
        UnknownBackendError: no such backend.
        BackendUnavailableError: the backend's module cannot be imported (names it).
    """
    cls = _REGISTERED.get(name)
    if cls is not None:
        return cls
    target = _entry_points().get(name)
    if target is None:
        raise UnknownBackendError(
            f"unknown backend {name!r}", hint=f"choose one of: {', '.join(names())}, auto"
        )
    module_name, _, attr = target.partition(":")
    try:
        obj: type[Backend] = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} cannot be loaded from {target}: {exc}",
            hint=f"install the package that provides {module_name.split('.')[0]!r}",
        ) from None
    except AttributeError:
        raise BackendUnavailableError(f"backend {name!r}: {module_name} has no {attr!r}") from None
    if getattr(obj, "name", None) != name:
        raise BackendUnavailableError(
            f"entry point {name!r} = {target} is not a backend named {name!r}"
        )
    cls = register_backend(obj)
    return cls


_INSTANCES: dict[tuple[str, Path], Backend] = {}


def get_backend(
    name: str, home: Home | None = None, config: BackendConfig | None = None
) -> Backend:
    """The instance of backend ``name`` for ``home`` (default: ``ROLLBOX_HOME``).

    One instance per (backend, home) per process, so what ``prepare()`` builds (agent
    binary, seccomp filter, accelerator probe) is done once, not per sandbox. A ``config``
    replaces the shared instance's tuning (environment overrides still apply).
    """
    home = home or Home.from_env()
    key = (name, home.root)
    with _LOCK:
        inst = _INSTANCES.get(key)
    if inst is None or config is not None:
        made = backend_class(name)(home, config=config)
        with _LOCK:
            inst = _INSTANCES.setdefault(key, made) if config is None else made
            if config is not None:
                _INSTANCES[key] = made
    return inst


def new_backend(name: str, home: Home, *, detached: bool = False) -> Backend:
    """A private instance of backend ``name`` (not the shared one): with ``detached``, its
    sandboxes (and forks) have no owner process and outlive this one (CLI)."""
    return backend_class(name)(home, detached=detached)
