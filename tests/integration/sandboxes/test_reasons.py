"""Limit reasons at the Sandbox API level on real namespace and gVisor sandboxes: a memory hog
(memory_mb=64), a fork bomb (pids=32), a ``dd`` filling a disk_mb-limited upper, a TTL of a
few seconds under a long exec. Each reason is asserted, and the absence of every reason on a
plain command (the checks can fail)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rollbox.backends.base import Backend
from rollbox.backends.common.reasons import seen
from rollbox.backends.state import list_states
from rollbox.config import Home
from rollbox.errors import ExecTimeoutError, SandboxExhaustedError, SandboxExpiredError
from rollbox.models import BaselineInfo, ExecResult, Limits, SandboxSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

BACKENDS = ["namespace", "gvisor"]

# allocates 1 MiB at a time and touches it, until killed
HOG = "python3 -c 'b=[]\nwhile True: b.append(bytearray(1 << 20))'"
# 64 background sleepers against pids=32: forks fail, the shell reports it and goes on
FORKS = "for i in $(seq 64); do sleep 3 & done; wait; echo done"
FILL = "dd if=/dev/zero of=/tmp/fill bs=1M count=64; echo dd-exit=$?"


def _spec(baseline: BaselineInfo, **limits: int) -> SandboxSpec:
    return SandboxSpec(baseline=baseline.digest, limits=Limits(**limits))  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_exec_reasons(
    backend: str, backend_or_skip: Callable[[str], Backend], dev_baseline: BaselineInfo
) -> None:
    be = backend_or_skip(backend)

    async def go() -> None:
        h = await be.create(_spec(dev_baseline, memory_mb=64, pids=32, disk_mb=16), dev_baseline)
        try:
            plain = await h.exec("echo hi; head -c 1000000 /dev/zero > /tmp/small")
            assert plain.ok and plain.reasons == [], plain
            assert seen(h) == []

            r: ExecResult = await asyncio.wait_for(h.exec(["bash", "-c", FORKS], timeout=60), 90)
            assert r.pids_exhausted and "pids_exhausted" in r.reasons, r
            assert not r.oom_killed and not r.disk_full

            r = await h.exec(["bash", "-c", FILL], timeout=60)
            assert r.disk_full and r.reasons == ["disk_full"], r
            assert "No space left on device" in r.stderr
            # freeing the space clears it: the flag describes the disk, not the past
            r = await h.exec("rm -f /tmp/fill")
            assert r.ok and not r.disk_full

            r = await h.exec(["bash", "-c", HOG], timeout=60)
            assert r.oom_killed and r.exit_code == 137, r
            assert "oom_killed" in r.reasons
            assert seen(h) == ["pids_exhausted", "disk_full", "oom_killed"]
        finally:
            await h.destroy()

    asyncio.run(go())


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_until_its_timeout(
    backend: str, backend_or_skip: Callable[[str], Backend], dev_baseline: BaselineInfo
) -> None:
    """The timeout error carries the reason; on gVisor the bomb may instead reach the host
    task limit first, which kills the sandbox: then the error says pids_exhausted."""
    be = backend_or_skip(backend)

    async def go() -> None:
        h = await be.create(_spec(dev_baseline, pids=32), dev_baseline)
        try:
            with pytest.raises((ExecTimeoutError, SandboxExhaustedError)) as err:
                await h.exec(["bash", "-c", "while true; do sleep 5 & done"], timeout=3)
            if isinstance(err.value, ExecTimeoutError):
                assert err.value.reasons == ["pids_exhausted"]
            else:
                assert backend == "gvisor" and err.value.reason == "pids_exhausted"
                assert "host task limit" in str(err.value)
            assert seen(h) == ["pids_exhausted"]
        finally:
            await h.destroy()

    asyncio.run(go())


@pytest.mark.parametrize("backend", BACKENDS)
def test_ttl_expiry_mid_exec_names_the_ttl(
    backend: str,
    backend_or_skip: Callable[[str], Backend],
    dev_baseline: BaselineInfo,
    sbx_home: Home,
) -> None:
    be = backend_or_skip(backend)

    async def go() -> None:
        spec = _spec(dev_baseline).model_copy(update={"ttl_s": 3.0})
        h = await be.create(spec, dev_baseline)
        try:
            with pytest.raises(SandboxExpiredError, match=r"reached its TTL of 3 s") as info:
                await asyncio.wait_for(h.exec("sleep 60", timeout=50), 55)
            assert info.value.reason == "ttl_expired"
            assert seen(h) == ["ttl_expired"]
            # the next call names the TTL too, not just "destroyed"
            with pytest.raises(SandboxExpiredError):
                await h.exec("true")
        finally:
            await h.destroy()
        assert [i.id for i in list_states(sbx_home) if i.id == h.id] == []

    asyncio.run(go())
