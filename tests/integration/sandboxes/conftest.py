"""Fixtures for sandbox tests: a per-test home sharing the session's baseline store."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollbox.backends.base import Backend
from rollbox.backends.registry import get_backend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import BaselineInfo

DEV_TAR = Path("/var/tmp/rollbox-dev/rootfs.tar")
DEV_NAME = "rollbox-test/dev-rootfs"
SHARED = ("oci", "layers", "baselines", "cache")


@pytest.fixture(scope="session")
def dev_baseline(shared_home: Home) -> BaselineInfo:
    """A Debian baseline in the shared home: the dev rootfs tar when this machine has it,
    else the default baseline (bootstrapped once)."""
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(shared_home)
    if DEV_TAR.exists():
        found = store.find_name(DEV_NAME)
        return found if found is not None else store.import_rootfs(DEV_TAR, names=[DEV_NAME])
    return store.default()


@pytest.fixture
def sbx_home(
    tmp_path: Path, shared_home: Home, dev_baseline: BaselineInfo, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Home]:
    """A fresh home (own tag, own sandboxes) whose baseline store is the shared one."""
    root = tmp_path / "home"
    root.mkdir()
    for name in SHARED:
        (shared_home.root / name).mkdir(exist_ok=True)
        os.symlink(shared_home.root / name, root / name)
    monkeypatch.setenv("ROLLBOX_HOME", str(root))
    home = Home(root).ensure()
    yield home
    # Whatever a failing test left: clean it up so it does not pollute the machine.
    for backend in ("namespace", "gvisor"):
        try:
            get_backend(backend, home).cleanup_orphans()
        except Exception:
            pass
    from rollbox.backends.state import list_states

    for info in list_states(home):
        try:
            be = get_backend(info.backend, home)
            destroy = getattr(be, "destroy_by_id", None)
            if destroy is not None:
                destroy(info.id)
        except Exception:
            pass


@pytest.fixture
def backend_or_skip(sbx_home: Home) -> Callable[[str], Backend]:
    """``f(name)``: the backend ``name`` prepared for ``sbx_home``, or skip the test (with
    the reason) when its ``prepare()`` says it is unavailable here."""

    def make(name: str) -> Backend:
        be = get_backend(name, sbx_home)
        try:
            be.prepare()
        except BackendUnavailableError as exc:
            pytest.skip(f"backend {name} unavailable: {exc}")
        return be

    return make
