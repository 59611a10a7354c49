"""Bounded fan-out: a fixed pool of workers pulling work from one lazy iterator.

A run of N rollouts at concurrency C holds C coroutines and the iterator's state, never one
task (or one semaphore waiter) per rollout: memory stays O(C), and cancelling the run
cancels C tasks, not N (with one waiter per rollout, SIGTERM on a 100,000-rollout run took
minutes, each cancelled waiter waking the next).

The run-size cap lives here too: ``tasks × attempts`` above :data:`MAX_ROLLOUTS` must be
asked for explicitly (``--max-rollouts``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from rollbox.errors import InvalidInputError

T = TypeVar("T")

MAX_ROLLOUTS = 10_000
"""Rollouts one run may hold unless ``--max-rollouts`` raises the limit."""


def check_size(total: int, limit: int | None) -> None:
    """Refuse a run larger than its limit.

    Args:
        total: tasks × attempts of the run.
        limit: ``--max-rollouts`` (None: :data:`MAX_ROLLOUTS`).

    Raises:
        InvalidInputError: ``total`` is above the limit, or the limit is not positive.
    """
    if limit is not None and limit < 1:
        raise InvalidInputError("--max-rollouts must be at least 1")
    cap = MAX_ROLLOUTS if limit is None else limit
    if total > cap:
        flag = f"--max-rollouts {total}"
        raise InvalidInputError(
            f"this run would hold {total:,} rollouts (tasks × attempts), more than the "
            f"limit of {cap:,} per run",
            hint=f"lower --attempts, or raise the limit with {flag}",
        )


async def run_pool(
    items: Iterable[T], worker: Callable[[T], Awaitable[None]], concurrency: int
) -> None:
    """Run ``worker`` on every item, at most ``concurrency`` at a time.

    ``concurrency`` tasks share one iterator (``next`` is synchronous, so no two workers
    ever take the same item); each takes the next item when its previous one finished.
    Items are produced only when a worker is free.

    Raises:
        BaseExceptionGroup: a worker raised (the other workers are cancelled first).
        asyncio.CancelledError: the caller was cancelled (every worker unwound).
    """
    it = iter(items)
    parent = asyncio.current_task()

    async def work() -> None:
        me = asyncio.current_task()
        for item in it:
            # Python 3.11's wait_for can swallow a cancellation that races with the awaited
            # result: a worker then goes on. A pending cancellation of the pool or of the
            # worker still shows in cancelling(): stop pulling work then.
            if (parent is not None and parent.cancelling()) or (me is not None and me.cancelling()):
                raise asyncio.CancelledError
            await worker(item)

    async with asyncio.TaskGroup() as tg:
        for _ in range(max(1, concurrency)):
            tg.create_task(work())
