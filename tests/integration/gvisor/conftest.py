"""Fixtures for gVisor-specific tests (the shared ones live in tests/integration/sandboxes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from requirebackends import backend_unavailable
from rollbox.backends.gvisor import GVisorBackend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import BaselineInfo


@pytest.fixture(scope="session")
def gv_baseline(dev_baseline: BaselineInfo) -> BaselineInfo:
    """The session's Debian baseline (python3 inside)."""
    return dev_baseline


@pytest.fixture
def gv_home(linked_home: Home, gv_baseline: BaselineInfo) -> Iterator[Home]:
    """A fresh home (own tag) sharing the session's baseline store; orphans reaped after."""
    home = linked_home
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
        backend_unavailable("gvisor", exc)
    return be
