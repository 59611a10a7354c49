"""Fixtures for microVM tests: a per-test home sharing the session's baseline store and VM
assets (kernel, initramfs, disk images), a Debian baseline, and the prepared backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.backends.microvm import MicroVMBackend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import BaselineInfo

DEV_TAR = Path("/var/tmp/rollbox-dev/rootfs.tar")
DEV_NAME = "rollbox-test/dev-rootfs"
SHARED = ("oci", "layers", "baselines", "cache")


@pytest.fixture(scope="session")
def vm_baseline(shared_home: Home) -> BaselineInfo:
    """A Debian baseline with python3 in the shared home."""
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(shared_home)
    if DEV_TAR.exists():
        found = store.find_name(DEV_NAME)
        return found if found is not None else store.import_rootfs(DEV_TAR, names=[DEV_NAME])
    return store.default()


@pytest.fixture
def vm_home(
    tmp_path: Path, shared_home: Home, vm_baseline: BaselineInfo, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Home]:
    """A fresh home (own tag, sandboxes, snapshots) over the shared store."""
    root = tmp_path / "home"
    root.mkdir()
    for name in SHARED:
        (shared_home.root / name).mkdir(exist_ok=True)
        os.symlink(shared_home.root / name, root / name)
    monkeypatch.setenv("ROLLBOX_HOME", str(root))
    home = Home(root).ensure()
    yield home
    MicroVMBackend(home).cleanup_orphans()


@pytest.fixture
def vm_backend(vm_home: Home) -> MicroVMBackend:
    """The prepared microvm backend for ``vm_home`` (skips when QEMU is unavailable)."""
    be = MicroVMBackend(vm_home)
    try:
        be.prepare()
    except BackendUnavailableError as exc:
        pytest.skip(f"microvm unavailable: {exc}")
    return be
