"""The cgroup-v2 guest: one rollbox microVM booted for the module, with rollbox inside.

These tests must fail, never skip, when the guest cannot boot: the fixture raises.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox.config import Home
from v2.guest import Guest, boot


@pytest.fixture(scope="module")
def guest(shared_home: Home) -> Iterator[Guest]:
    """A booted cgroup-v2 guest with this checkout's rollbox (fails when it cannot boot)."""
    with boot(shared_home) as g:
        yield g
