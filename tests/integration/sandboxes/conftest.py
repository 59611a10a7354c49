"""Fixtures for sandbox tests: a per-test home sharing the session's baseline store."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from requirebackends import backend_unavailable
from rollbox.backends.base import Backend
from rollbox.backends.registry import get_backend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import BaselineInfo


@pytest.fixture
def sbx_home(linked_home: Home, dev_baseline: BaselineInfo) -> Iterator[Home]:
    """A fresh home (own tag, own sandboxes) whose baseline store is the shared one."""
    home = linked_home
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
            get_backend(info.backend, home).destroy_by_id(info.id)
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
            backend_unavailable(name, exc)
        return be

    return make
