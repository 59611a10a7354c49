"""Limit-reason helpers: the disk-full rule, fork-failure messages, the TTL error and the
``tracked`` exec wrapper (with fake handles; the real sandboxes are in
tests/integration/sandboxes/test_reasons.py and tests/vm/test_reasons_vm.py)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from rollbox.backends.common.reasons import (
    expired_error,
    fork_failed,
    is_full,
    note,
    seen,
    tracked,
)
from rollbox.errors import (
    ExecTimeoutError,
    SandboxCrashedError,
    SandboxExhaustedError,
    SandboxExpiredError,
)
from rollbox.models import ExecResult, SandboxInfo, SandboxSpec, utcnow


def _info(ttl: float | None, age: float) -> SandboxInfo:
    created = utcnow() - timedelta(seconds=age)
    return SandboxInfo(
        id="sbx-test",
        backend="namespace",
        baseline="sha256:" + "0" * 64,
        spec=SandboxSpec(baseline="x", ttl_s=ttl),
        created_at=created,
        expires_at=None if ttl is None else created + timedelta(seconds=ttl),
    )


class Fake:
    """A handle whose exec does what the test tells it to."""

    def __init__(self, info: SandboxInfo, outcome: ExecResult | BaseException) -> None:
        self._info = info
        self.outcome = outcome

    @property
    def info(self) -> SandboxInfo:
        return self._info

    @tracked
    async def exec(self, cmd: str) -> ExecResult:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _result(**flags: bool) -> ExecResult:
    return ExecResult(exit_code=1, stdout="", stderr="", duration_s=0.1, **flags)


def test_is_full() -> None:
    total = 16 << 20
    assert is_full(0, total) and is_full(100_000, total)  # < 1 % of 16 MiB
    assert not is_full(1 << 20, total)
    assert not is_full(-1, -1)  # unknown (an old guest agent) is never full


def test_fork_failed_messages() -> None:
    assert fork_failed("bash: fork: retry: Resource temporarily unavailable\n")
    assert fork_failed(b"sh: 0: Cannot fork\n")
    assert fork_failed("sh: can't fork: Resource temporarily unavailable")
    assert not fork_failed("Resource temporarily unavailable")  # EAGAIN of a read: no fork
    assert not fork_failed("")


def test_reasons_order_and_fields() -> None:
    assert _result().reasons == []
    r = _result(disk_full=True, oom_killed=True, pids_exhausted=True)
    assert r.reasons == ["oom_killed", "pids_exhausted", "disk_full"]


def test_tracked_notes_result_and_error_reasons() -> None:
    h = Fake(_info(None, 0), _result(oom_killed=True))
    asyncio.run(h.exec("x"))
    h.outcome = _result(disk_full=True, oom_killed=True)
    asyncio.run(h.exec("x"))
    assert seen(h) == ["oom_killed", "disk_full"]  # each once, first seen first
    h.outcome = ExecTimeoutError("t", reasons=["pids_exhausted"])
    with pytest.raises(ExecTimeoutError):
        asyncio.run(h.exec("x"))
    h.outcome = SandboxExhaustedError("gone", reason="pids_exhausted")
    with pytest.raises(SandboxExhaustedError):
        asyncio.run(h.exec("x"))
    assert seen(h) == ["oom_killed", "disk_full", "pids_exhausted"]
    assert seen(object()) == []
    note(h, [])
    assert len(seen(h)) == 3


def test_tracked_names_a_passed_ttl() -> None:
    h = Fake(_info(30.0, 31.0), SandboxCrashedError("the sandbox agent connection broke"))
    with pytest.raises(SandboxExpiredError, match=r"sandbox sbx-test reached its TTL of 30 s"):
        asyncio.run(h.exec("x"))
    assert seen(h) == ["ttl_expired"]
    # a crash before the TTL stays a crash
    h = Fake(_info(30.0, 5.0), SandboxCrashedError("boom"))
    with pytest.raises(SandboxCrashedError, match="boom") as exc:
        asyncio.run(h.exec("x"))
    assert not isinstance(exc.value, SandboxExpiredError) and seen(h) == []
    # no TTL at all: a crash stays a crash
    h = Fake(_info(None, 500.0), SandboxCrashedError("boom"))
    with pytest.raises(SandboxCrashedError):
        asyncio.run(h.exec("x"))
    assert seen(h) == []


def test_expired_error_is_one_line_with_the_ttl() -> None:
    err = expired_error(_info(2.5, 3.0))
    assert err.reason == "ttl_expired" and "\n" not in err.one_line()
    assert "TTL of 2.5 s" in err.one_line()


class Sleeper(Fake):
    @tracked
    async def exec(self, cmd: str) -> ExecResult:
        await asyncio.sleep(30)
        raise AssertionError("not reached")


def test_tracked_ends_a_command_at_the_ttl_when_the_reaper_is_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from rollbox.backends.common import reasons

    monkeypatch.setattr(reasons, "TTL_GRACE_S", 0.2)
    h = Sleeper(_info(30.0, 29.7), _result())  # 0.3 s left
    t0 = time.monotonic()
    with pytest.raises(SandboxExpiredError, match="TTL of 30 s"):
        asyncio.run(h.exec("x"))
    assert time.monotonic() - t0 < 5 and seen(h) == ["ttl_expired"]
    # an exec's own timeout is not mistaken for the TTL
    h = Fake(_info(30.0, 0.0), ExecTimeoutError("command timed out after 1s"))
    with pytest.raises(ExecTimeoutError) as exc:
        asyncio.run(h.exec("x"))
    assert not isinstance(exc.value, SandboxExpiredError) and seen(h) == []
