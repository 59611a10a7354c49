"""The conformance suite every backend must pass (the tests parametrize it over backends).

Each check is an ``async`` function taking a :class:`Harness` and raising
``AssertionError`` with a message when the backend falls short. The harness creates
sandboxes through the backend contract only (so the microVM backend can reuse every check)
and destroys whatever a check left when :meth:`Harness.close` runs.

Run one check from a test::

    harness = Harness(backend, baseline)
    try:
        await CHECKS["file_isolation"](harness)
    finally:
        await harness.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rollbox.backends.base import Backend
from rollbox.backends.conformance.exec_checks import (
    BACKEND_ENV_EXTRAS,
    EXEC_PATH,
    exec_basics,
    exec_environment,
)
from rollbox.backends.conformance.file_copy import file_copy_links
from rollbox.backends.conformance.harness import Harness, check, scoped_diff, sh
from rollbox.backends.conformance.isolation import (
    baseline_untouched,
    env_secret_isolation,
    file_isolation,
    no_host_files,
    path_escapes,
    process_isolation,
)
from rollbox.backends.conformance.lifecycle import (
    network_none,
    no_leftovers,
    pause_resume,
    snapshot_and_fork,
)
from rollbox.backends.conformance.limits import (
    disk_filler,
    fork_bomb,
    memory_hog,
    timeout_no_survivors,
)
from rollbox.models import BaselineInfo

CHECKS: dict[str, Callable[[Harness], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        exec_basics,
        exec_environment,
        file_isolation,
        process_isolation,
        env_secret_isolation,
        no_host_files,
        baseline_untouched,
        path_escapes,
        file_copy_links,
        fork_bomb,
        memory_hog,
        disk_filler,
        timeout_no_survivors,
        network_none,
        no_leftovers,
        pause_resume,
        snapshot_and_fork,
    )
}
"""Every conformance check by name."""


async def run_check(name: str, backend: Backend, baseline: BaselineInfo) -> None:
    """Run one check with a fresh harness and reap its sandboxes."""
    t = Harness(backend, baseline)
    try:
        await CHECKS[name](t)
    finally:
        await t.close()


def run_check_sync(name: str, backend: Backend, baseline: BaselineInfo) -> None:
    """Blocking :func:`run_check`."""
    asyncio.run(run_check(name, backend, baseline))


__all__ = [
    "BACKEND_ENV_EXTRAS",
    "CHECKS",
    "EXEC_PATH",
    "Harness",
    "check",
    "run_check",
    "run_check_sync",
    "scoped_diff",
    "sh",
]
