"""Backends registered by name, imported lazily (Harbor's environment factory).

A backend module is imported only when asked for, so a host without QEMU can still use
``namespace``; a missing tool surfaces from :meth:`Backend.prepare` as a
``BackendUnavailableError`` naming the Debian package to install.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path

from rollbox.backends.base import Backend
from rollbox.config import Home
from rollbox.errors import UnknownBackendError

_BACKENDS: dict[str, str] = {
    "namespace": "rollbox.backends.namespace:NamespaceBackend",
    "gvisor": "rollbox.backends.gvisor:GVisorBackend",
    "microvm": "rollbox.backends.microvm:MicroVMBackend",
}


def names() -> list[str]:
    """Registered backend names."""
    return list(_BACKENDS)


def backend_class(name: str) -> type[Backend]:
    """The class registered under ``name``.

    Raises:
        UnknownBackendError: no such backend.
    """
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise UnknownBackendError(
            f"unknown backend {name!r}", hint=f"choose one of: {', '.join(_BACKENDS)}, auto"
        ) from None
    module_name, _, attr = target.partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module_name), attr)
    return cls


_INSTANCES: dict[tuple[str, Path], Backend] = {}
_LOCK = threading.Lock()


def get_backend(name: str, home: Home | None = None) -> Backend:
    """The instance of backend ``name`` for ``home`` (default: ``ROLLBOX_HOME``).

    One instance per (backend, home) per process, so what ``prepare()`` builds (agent
    binary, seccomp filter, accelerator probe) is done once, not per sandbox.
    """
    home = home or Home.from_env()
    key = (name, home.root)
    with _LOCK:
        inst = _INSTANCES.get(key)
        if inst is None:
            inst = _INSTANCES[key] = backend_class(name)(home)
        return inst
