"""Harbor task workloads for the pilot: each rollout goes through the rollout runner."""

from __future__ import annotations

from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.pilot.measure import TaskRunner
from rollbox.pilot.workloads import Workload


def make_task_runner(workload: Workload, home: Home) -> TaskRunner:
    """A :data:`TaskRunner` that runs ``workload.task_dir`` with the ``oracle`` agent.

    Raises:
        InvalidInputError: the rollout runner is not available in this build.
    """
    raise InvalidInputError(
        "task-directory workloads need the rollout runner, which this build lacks",
        hint="use --workload sleep, cpu or disk",
    )
