"""Creating and finding sandboxes safely: a create (or fork) in flight when its caller is
cancelled is finished and disposed of; a sandbox's stored state is read by id."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from rollbox.backends.base import Backend, SandboxHandle
from rollbox.config import Home
from rollbox.errors import SandboxNotFoundError
from rollbox.models import BaselineInfo, SandboxInfo, SandboxSpec

T = TypeVar("T")
log = logging.getLogger("rollbox")


async def finish_or_dispose(
    make: Awaitable[T], dispose: Callable[[T], Awaitable[None]], what: str = "sandbox"
) -> T:
    """Await ``make``; if the caller is cancelled meanwhile, let ``make`` finish anyway and
    ``dispose`` of its result, then re-raise the cancellation.

    A backend's create runs in a worker thread (or boots a VM): cancelling the awaiting task
    does not stop it, and what it then creates would belong to nobody. Further cancellations
    while waiting are absorbed (the caller is cancelled already).
    """
    inner = asyncio.ensure_future(make)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        while not inner.done():
            try:
                await asyncio.wait({inner})
            except asyncio.CancelledError:
                continue  # a second Ctrl-C: still dispose of it first
        if not inner.cancelled() and inner.exception() is None:
            try:
                await asyncio.shield(dispose(inner.result()))
            except Exception as exc:  # cancelling: there is no caller left to raise to
                log.warning("%s created during cancellation not removed: %s", what, exc)
        raise


async def create_handle(
    be: Backend,
    spec: SandboxSpec,
    baseline: BaselineInfo,
    *,
    on_created: Callable[[SandboxHandle], None] | None = None,
) -> SandboxHandle:
    """``be.create(spec, baseline)``, safe against cancellation: a sandbox whose create was
    in flight when the caller was cancelled is waited for and destroyed.

    Args:
        be: the backend.
        spec: the checked spec.
        baseline: the resolved baseline.
        on_created: called with a handle created during cancellation, before it is
            destroyed (e.g. to list its id in a record).

    Raises:
        asyncio.CancelledError: the caller was cancelled (nothing is left running).
        BackendError: as :meth:`Backend.create`.
    """

    async def dispose(handle: SandboxHandle) -> None:
        if on_created is not None:
            on_created(handle)
        await handle.destroy()

    return await finish_or_dispose(be.create(spec, baseline), dispose)


def _state_path(home: Home, sandbox_id: str) -> Path:
    return home.sandboxes / sandbox_id / "state.json"


def read_state(home: Home, sandbox_id: str) -> SandboxInfo:
    """The stored state of sandbox ``sandbox_id`` in ``home``.

    Raises:
        SandboxNotFoundError: no such sandbox.
    """
    path = _state_path(home, sandbox_id)
    try:
        return SandboxInfo.model_validate(json.loads(path.read_text()))
    except (FileNotFoundError, NotADirectoryError):
        raise SandboxNotFoundError(
            f"no sandbox {sandbox_id!r} in {home.root}", hint="see 'rollbox sandbox ls'"
        ) from None
