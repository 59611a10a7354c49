"""What a run is asked to do (:class:`RunOptions`), its progress callbacks, seeds and threads."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rollbox.errors import InvalidInputError
from rollbox.models import RolloutRecord, RunRecord


@dataclass
class RunOptions:
    """What ``rollbox run`` was asked to do (stored in ``RunRecord.args`` for resume)."""

    task_dirs: list[str]
    agent: str = "oracle"
    attempts: int | None = None
    """Attempts per task; None: each task's ``[rollbox] attempts`` or 1."""
    concurrency: int = 4
    backend: str = "auto"
    retries: int = 1
    group_from_snapshot: bool = False
    seed: int = 0
    max_rollouts: int | None = None
    """Largest tasks × attempts allowed (None: ``MAX_ROLLOUTS``)."""

    def to_args(self) -> dict[str, Any]:
        """JSON-able form (``RunRecord.args``)."""
        return {
            "task_dirs": self.task_dirs,
            "agent": self.agent,
            "attempts": self.attempts,
            "concurrency": self.concurrency,
            "backend": self.backend,
            "retries": self.retries,
            "group_from_snapshot": self.group_from_snapshot,
            "seed": self.seed,
            "max_rollouts": self.max_rollouts,
        }

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> RunOptions:
        """Back from ``RunRecord.args``."""
        known = {k: v for k, v in args.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def validate(self) -> None:
        """Raises InvalidInputError for values no run can start with."""
        if not self.task_dirs:
            raise InvalidInputError("no task directories given", hint="rollbox run TASK_DIR...")
        if self.concurrency < 1:
            raise InvalidInputError("--concurrency must be at least 1")
        if self.attempts is not None and self.attempts < 1:
            raise InvalidInputError("--attempts must be at least 1")
        if self.retries < 0:
            raise InvalidInputError("--retries must be 0 or more")
        if self.max_rollouts is not None and self.max_rollouts < 1:
            raise InvalidInputError("--max-rollouts must be at least 1")


@dataclass
class RunEvents:
    """Callbacks for progress displays."""

    on_start: Callable[[RunRecord, int], None] | None = None
    """The run record and the number of slots to run."""
    on_rollout: Callable[[RolloutRecord], None] | None = None
    """A rollout record changed (started or finished)."""


def seed_for(run_id: str, task_digest_: str, attempt: int, base: int = 0) -> int:
    """A deterministic per-rollout seed (recorded; repro reuses it)."""
    h = hashlib.sha256(f"{base}:{run_id}:{task_digest_}:{attempt}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


def executor_for(concurrency: int) -> ThreadPoolExecutor:
    """A thread pool big enough for ``concurrency`` rollouts' blocking backend steps."""
    return ThreadPoolExecutor(
        max_workers=max(8, 2 * concurrency + 4), thread_name_prefix="rollbox-run"
    )
