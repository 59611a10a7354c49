"""The bounded worker pool and the run-size cap (issue 15, item 3)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from rollbox.errors import InvalidInputError
from rollbox.rollouts.scheduler import MAX_ROLLOUTS, check_size, run_pool


def test_pool_holds_concurrency_items_and_pulls_lazily() -> None:
    produced = 0
    running = 0
    peak = 0
    ahead = 0

    def items() -> Iterator[int]:
        nonlocal produced
        for i in range(1000):
            produced += 1
            yield i

    done: list[int] = []

    async def worker(i: int) -> None:
        nonlocal running, peak, ahead
        running += 1
        peak = max(peak, running)
        ahead = max(ahead, produced - len(done))  # taken from the iterator, not yet finished
        await asyncio.sleep(0)
        running -= 1
        done.append(i)

    asyncio.run(run_pool(items(), worker, 4))
    assert sorted(done) == list(range(1000))
    assert peak == 4
    assert ahead <= 4  # pending work is O(concurrency), never the whole run


def test_pool_cancellation_is_quick_with_a_huge_backlog() -> None:
    """100,000 pending items: cancelling the pool cancels its 4 workers, not 100,000
    waiters (the old one-task-per-rollout design took minutes here)."""
    started = asyncio.Event()

    async def worker(_i: int) -> None:
        started.set()
        await asyncio.sleep(3600)

    async def main() -> float:
        task = asyncio.create_task(run_pool(iter(range(100_000)), worker, 4))
        await started.wait()
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.perf_counter() - t0

    assert asyncio.run(main()) < 0.5


def test_pool_stops_pulling_after_a_worker_fails() -> None:
    pulled: list[int] = []

    def items() -> Iterator[int]:
        for i in range(100):
            pulled.append(i)
            yield i

    async def worker(i: int) -> None:
        await asyncio.sleep(0.001)
        if i == 5:
            raise RuntimeError("boom")

    with pytest.raises(BaseExceptionGroup):
        asyncio.run(run_pool(items(), worker, 2))
    assert len(pulled) < 20


def test_size_cap() -> None:
    check_size(MAX_ROLLOUTS, None)
    with pytest.raises(InvalidInputError, match=r"--max-rollouts 10001"):
        check_size(MAX_ROLLOUTS + 1, None)
    check_size(100_000, 100_000)
    with pytest.raises(InvalidInputError, match="more than the limit of 5"):
        check_size(6, 5)
    with pytest.raises(InvalidInputError, match="at least 1"):
        check_size(1, 0)


def test_pool_stops_even_when_a_worker_swallows_its_cancellation() -> None:
    """Python 3.11's wait_for returns the inner result and drops the cancellation when both
    happen at once; a worker that lost its cancellation must still stop pulling work."""
    started = asyncio.Event()
    release = asyncio.Event()
    taken: list[int] = []

    async def worker(i: int) -> None:
        taken.append(i)
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            pass  # swallowed, as the wait_for race does

    async def main() -> bool:
        task = asyncio.create_task(run_pool(iter(range(100_000)), worker, 4))
        await started.wait()
        await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        release.set()  # (when the pool went on: let it run out so the loop can close)
        await asyncio.wait({task})
        return bool(done) and task.cancelled()

    assert asyncio.run(main()), "the pool went on pulling work after its cancellation"
    assert len(taken) == 4  # no worker took another item after the cancellation
