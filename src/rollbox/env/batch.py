"""Many envs at once, for a trainer that steps a batch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollbox.env.aio import AsyncTaskEnv
from rollbox.errors import InvalidInputError


async def batch(
    task_dirs: list[str | Path], n: int = 1, concurrency: int = 8, **kwargs: Any
) -> list[AsyncTaskEnv]:
    """Create and reset ``n`` envs per task, at most ``concurrency`` resets at a time.

    Args:
        task_dirs: task directories.
        n: envs per task.
        concurrency: resets in flight at once.
        **kwargs: passed to :meth:`AsyncTaskEnv.create` (``backend``, ``seed``, ``db``, ...).

    Returns:
        ``len(task_dirs) * n`` reset envs, task-major; each one's first observation is its
        ``last_observation``. Close each (or use them as async context managers).

    Raises:
        InvalidInputError: ``n`` or ``concurrency`` < 1, or no task directories. If one env
            fails to start, every env already made is closed and the error raised.
    """
    if n < 1 or concurrency < 1 or not task_dirs:
        raise InvalidInputError(
            f"batch needs task_dirs, n >= 1 and concurrency >= 1 "
            f"(got {len(task_dirs)} dirs, n={n}, concurrency={concurrency})",
            hint="pass at least one task directory and positive numbers",
        )
    gate = asyncio.Semaphore(concurrency)
    templates = [await AsyncTaskEnv.create(d, **kwargs) for d in task_dirs]
    envs: list[AsyncTaskEnv] = []
    for t in templates:
        envs.append(t)
        for _ in range(n - 1):
            envs.append(
                AsyncTaskEnv(
                    t.task,
                    t.home,
                    type(t.meta)(t.meta.url, home=t.home),
                    t.blobs,
                    backend=t.backend,
                    baseline=t.baseline,
                    seed=t.seed,
                    caller=t.caller,
                    owns_meta=True,
                )
            )

    async def one(env: AsyncTaskEnv) -> None:
        async with gate:
            await env.reset()

    try:
        async with asyncio.TaskGroup() as tg:
            for env in envs:
                tg.create_task(one(env))
    except BaseException:
        await asyncio.gather(*(e.close() for e in envs), return_exceptions=True)
        raise
    return envs
