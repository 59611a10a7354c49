"""Fixtures for gVisor-specific tests (the shared ones live in tests/integration/sandboxes)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.backends.gvisor import GVisorBackend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import BaselineInfo

DEV_TAR = Path("/var/tmp/rollbox-dev/rootfs.tar")
DEV_NAME = "rollbox-test/dev-rootfs"
SHARED = ("oci", "layers", "baselines", "cache")


@pytest.fixture(scope="session")
def gv_baseline(shared_home: Home) -> BaselineInfo:
    """A Debian baseline (python3 inside) in the shared home."""
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(shared_home)
    if DEV_TAR.exists():
        found = store.find_name(DEV_NAME)
        return found if found is not None else store.import_rootfs(DEV_TAR, names=[DEV_NAME])
    return store.default()


@pytest.fixture
def gv_home(
    tmp_path: Path, shared_home: Home, gv_baseline: BaselineInfo, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Home]:
    """A fresh home (own tag) sharing the session's baseline store; orphans reaped after."""
    root = tmp_path / "home"
    root.mkdir()
    for name in SHARED:
        (shared_home.root / name).mkdir(exist_ok=True)
        os.symlink(shared_home.root / name, root / name)
    monkeypatch.setenv("ROLLBOX_HOME", str(root))
    home = Home(root).ensure()
    yield home
    try:
        be = GVisorBackend(home)
        be.prepare()
        for info in be.list_sandboxes():
            be.destroy_by_id(info.id)
        be.cleanup_orphans()
    except Exception:
        pass


@pytest.fixture
def gvisor(gv_home: Home) -> GVisorBackend:
    """A prepared gvisor backend for ``gv_home`` (skips when runsc is unavailable)."""
    be = GVisorBackend(gv_home)
    try:
        be.prepare()
    except BackendUnavailableError as exc:
        pytest.skip(f"gvisor unavailable: {exc}")
    return be
