"""Fixtures for microVM tests: a per-test home sharing the session's baseline store and VM
assets (kernel, initramfs, disk images), a Debian baseline, and the prepared backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from requirebackends import backend_unavailable
from rollbox.backends.microvm import MicroVMBackend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import BaselineInfo


@pytest.fixture(scope="session")
def vm_baseline(dev_baseline: BaselineInfo) -> BaselineInfo:
    """The session's Debian baseline with python3."""
    return dev_baseline


@pytest.fixture
def vm_home(linked_home: Home, vm_baseline: BaselineInfo) -> Iterator[Home]:
    """A fresh home (own tag, sandboxes, snapshots) over the shared store."""
    home = linked_home
    yield home
    MicroVMBackend(home).cleanup_orphans()


@pytest.fixture
def vm_backend(vm_home: Home) -> MicroVMBackend:
    """The prepared microvm backend for ``vm_home`` (skips when QEMU is unavailable)."""
    be = MicroVMBackend(vm_home)
    try:
        be.prepare()
    except BackendUnavailableError as exc:
        backend_unavailable("microvm", exc)
    return be
