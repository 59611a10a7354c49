"""Concurrent creates and execs through one backend instance (rollouts run in parallel)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from rollbox.backends.conformance import scoped_diff
from rollbox.backends.namespace import NamespaceBackend
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, SandboxSpec

pytestmark = pytest.mark.root


def _exes(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/exe"))
    return out


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
            # the agent runs from a sealed memfd in every sandbox (read from the host: inside,
            # commands lack the agent's capabilities, so its /proc/1/exe is refused to them)
            exes = [_exes(h.cgroup.pids()) for h in hs]  # type: ignore[attr-defined]
            assert all(any(e.startswith("/memfd:rollbox-agent") for e in x) for x in exes), exes
        finally:
            await asyncio.gather(*[h.destroy() for h in hs])

    asyncio.run(go())
    assert scoped_diff(before, HostState.capture(sbx_home.sandboxes), sbx_home) == {}
