"""Concurrent creates and execs through one backend instance (rollouts run in parallel)."""

from __future__ import annotations

import asyncio

import pytest

from rollbox.backends.conformance import scoped_diff
from rollbox.backends.namespace import NamespaceBackend
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, SandboxSpec

pytestmark = pytest.mark.root


def test_parallel_creates_and_execs(sbx_home: Home, dev_baseline: BaselineInfo) -> None:
    before = HostState.capture(sbx_home.sandboxes)

    async def go() -> None:
        be = NamespaceBackend(sbx_home)  # not prepared: the creates race to prepare it
        spec = SandboxSpec(baseline=dev_baseline.digest)
        hs = await asyncio.gather(*[be.create(spec, dev_baseline) for _ in range(6)])
        try:
            assert len({h.id for h in hs}) == 6
            rs = await asyncio.gather(*[hs[0].exec(f"echo {i}; sleep 0.2") for i in range(20)])
            assert [r.stdout for r in rs] == [f"{i}\n" for i in range(20)]
            rs = await asyncio.gather(*[h.exec(["readlink", "/proc/1/exe"]) for h in hs])
            assert all(r.stdout.startswith("/memfd:rollbox-agent") for r in rs), rs
        finally:
            await asyncio.gather(*[h.destroy() for h in hs])

    asyncio.run(go())
    assert scoped_diff(before, HostState.capture(sbx_home.sandboxes), sbx_home) == {}
