"""AsyncSandbox.exec never loses a cancellation (issue 15, item 2): Python 3.11's
``wait_for`` returns a result that raced with a cancellation and drops the cancellation; the
facade re-raises it so a cancelled rollout or policy really stops."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollbox.backends.base import Backend
from rollbox.backends.registry import new_backend
from rollbox.config import Home
from rollbox.models import ExecResult
from rollbox.sandbox import AsyncSandbox


def _backend() -> Backend:
    """A real backend object (nothing of it runs: the handles below are doubles)."""
    return new_backend("namespace", Home(Path("/nonexistent-rollbox-home")))


class _RacingHandle:
    """An exec whose cancellation is swallowed the way wait_for's race does."""

    id = "sbx-fake"

    async def exec(self, cmd: Any, **_kw: Any) -> ExecResult:
        me = asyncio.current_task()
        assert me is not None
        asyncio.get_running_loop().call_soon(me.cancel)
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            pass  # the command's result "won": the cancellation is dropped here
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0)


class _PlainHandle(_RacingHandle):
    async def exec(self, cmd: Any, **_kw: Any) -> ExecResult:
        return ExecResult(exit_code=0, stdout="ok", stderr="", duration_s=0.0)


def test_a_swallowed_cancellation_is_raised_again() -> None:
    sbx = AsyncSandbox(_RacingHandle(), _backend())  # type: ignore[arg-type]
    after: list[str] = []

    async def caller() -> None:
        await sbx.exec("true")
        after.append("went on")  # without the re-raise the caller continues here

    async def main() -> None:
        task = asyncio.create_task(caller())
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert after == []


def test_no_cancellation_no_change() -> None:
    sbx = AsyncSandbox(_PlainHandle(), _backend())  # type: ignore[arg-type]
    assert asyncio.run(sbx.exec("true")).stdout == "ok"
