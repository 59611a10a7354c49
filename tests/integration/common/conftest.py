"""Fixtures for the common host-module tests: other engineers' sandboxes run at the same
time, so host-state diffs are narrowed to what this test's home could have made."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollbox.config import Home
from rollbox.hoststate import HostState

LeakCheck = Callable[[HostState, HostState], dict[str, list[str]]]


@pytest.fixture
def leaks(home: Home) -> LeakCheck:
    """``leaks(before, after)``: resources in ``after`` and not in ``before`` that carry
    this test home's tag or path (sandbox dirs: all new ones of the home)."""

    def check(before: HostState, after: HostState) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for kind, items in before.diff(after).items():
            mine = (
                items
                if kind == "sandbox_dirs"
                else [x for x in items if home.tag in x or str(home.root) in x]
            )
            if mine:
                out[kind] = mine
        return out

    return check
