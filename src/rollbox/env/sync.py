"""``TaskEnv``: the synchronous facade of :class:`~rollbox.env.aio.AsyncTaskEnv` (same names),
run on the one background event loop the sync ``Sandbox`` uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollbox.config import Home
from rollbox.env.aio import AsyncTaskEnv, Observation, StepResult
from rollbox.models import RolloutRecord, RunRecord, VerifierOutcome
from rollbox.sandbox.sync import _Loop


class TaskEnv:
    """One task as an RL environment (synchronous).

    ::

        with TaskEnv.create("examples/tasks/hello-file") as env:
            obs = env.reset()
            env.step({"tool": "write_file", "path": "/app/hello.txt",
                      "content": "Hello, rollbox!\\n"})
            print(env.step({"tool": "submit"}).reward)   # 1.0
    """

    def __init__(self, inner: AsyncTaskEnv) -> None:
        self.aio = inner
        """The async env this one drives."""

    @classmethod
    def create(
        cls,
        task_dir: str | Path,
        backend: str = "namespace",
        seed: int | None = None,
        db: str | None = None,
        *,
        caller: str = "python",
        home: Home | None = None,
    ) -> TaskEnv:
        """See :meth:`AsyncTaskEnv.create`."""
        return cls(
            _Loop.run(AsyncTaskEnv.create(task_dir, backend, seed, db, caller=caller, home=home))
        )

    @property
    def run(self) -> RunRecord:
        """The env's run record (sealed after close())."""
        return self.aio.run

    @property
    def records(self) -> list[RolloutRecord]:
        """Every finished episode's sealed record."""
        return self.aio.records

    @property
    def done(self) -> bool:
        """The current episode has ended (or none was started)."""
        return self.aio.done

    def reset(self) -> Observation:
        """See :meth:`AsyncTaskEnv.reset`."""
        return _Loop.run(self.aio.reset())

    def step(self, action: str | dict[str, Any]) -> StepResult:
        """See :meth:`AsyncTaskEnv.step`."""
        return _Loop.run(self.aio.step(action))

    def verify(self) -> VerifierOutcome:
        """See :meth:`AsyncTaskEnv.verify`."""
        return _Loop.run(self.aio.verify())

    def fork(self, n: int) -> list[TaskEnv]:
        """See :meth:`AsyncTaskEnv.fork`."""
        return [TaskEnv(e) for e in _Loop.run(self.aio.fork(n))]

    def close(self) -> None:
        """See :meth:`AsyncTaskEnv.close`."""
        _Loop.run(self.aio.close())

    def __enter__(self) -> TaskEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
