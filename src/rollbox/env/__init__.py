"""Step-driven environment API for RL trainers that hold the loop (reset -> step -> reward).

See ``docs/howto/env.md``. :class:`TaskEnv` (sync) and :class:`AsyncTaskEnv` (async) share
names; :func:`batch` makes many at once.
"""

from rollbox.env.actions import TOOLS, Action, parse_action
from rollbox.env.aio import AsyncTaskEnv, Observation, StepResult
from rollbox.env.batch import batch
from rollbox.env.errors import (
    EnvClosedError,
    EnvStateError,
    EpisodeDoneError,
    InvalidActionError,
    NoEpisodeError,
    UnknownToolError,
)
from rollbox.env.sync import TaskEnv

__all__ = [
    "TOOLS",
    "Action",
    "AsyncTaskEnv",
    "EnvClosedError",
    "EnvStateError",
    "EpisodeDoneError",
    "InvalidActionError",
    "NoEpisodeError",
    "Observation",
    "StepResult",
    "TaskEnv",
    "UnknownToolError",
    "batch",
    "parse_action",
]
