"""A run: tasks × attempts, with bounded concurrency, infra-only retries, groups and resume.

A rollout that ends in ``infra_error`` is retried (up to ``retries`` times) in a fresh sandbox;
the failed attempt's record is kept and linked both ways (``retry_of`` / ``retried_by``).
Task, agent and verifier failures are never retried: they are results.

``group_from_snapshot`` (or ``[rollbox] group_mode = "snapshot"``): per task, one sandbox is
set up, snapshotted into a baseline (parent recorded) and destroyed; the task's attempts all
start from that snapshot and share a ``group_id``.

Rollouts fan out through :func:`~rollbox.rollouts.scheduler.run_pool`: ``concurrency``
workers pull slots from a lazy iterator, so pending work is O(concurrency), not one task per
rollout; a run holds at most :data:`~rollbox.rollouts.scheduler.MAX_ROLLOUTS` rollouts unless
``max_rollouts`` raises the limit.

Cancellation (Ctrl-C, SIGTERM) cancels every rollout: each tears its sandboxes down (a create
in flight is waited for and destroyed) and saves itself as ``interrupted``; the run is saved
as ``interrupted``. A run whose process was killed (SIGKILL) is found by
:func:`reap_stale_runs` (its owner pid is gone) and marked the same way, as is any rollout
record left ``running``/``queued`` in a run no live process owns; ``resume`` then runs exactly
the slots (task, attempt) that have no final record.

Companion modules: ``run_options`` (RunOptions, RunEvents, seeds), ``stale`` (stale runs),
``baseline`` (a task's baseline), ``leaks`` (the cleanup check), ``repro`` (``rollbox repro``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox import __version__
from rollbox.config import Home
from rollbox.errors import InvalidInputError, RollboxError, TaskError
from rollbox.hoststate import HostState
from rollbox.ids import new_id
from rollbox.models import PhaseStamp, RolloutRecord, RunRecord, utcnow
from rollbox.rollouts import blame
from rollbox.rollouts.agents import Agent, parse_agent
from rollbox.rollouts.backend_choice import BackendChoice, choose_backend
from rollbox.rollouts.baseline import resolve_baseline
from rollbox.rollouts.leaks import _leftovers
from rollbox.rollouts.run_options import RunEvents, RunOptions, executor_for, seed_for
from rollbox.rollouts.runner import RolloutPlan, RolloutRunner
from rollbox.rollouts.scheduler import check_size, run_pool
from rollbox.rollouts.stale import (
    FINAL,
    UNFINISHED,
    interrupt_run,
    pid_alive,
    reap_stale_runs,
    stale_runs,
)
from rollbox.rollouts.tasks import Task, load_task, task_digest
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

# Re-exported: callers imported these from here before the split.
__all__ = [
    "FINAL",
    "UNFINISHED",
    "Run",
    "RunEvents",
    "RunOptions",
    "RunResult",
    "executor_for",
    "interrupt_run",
    "pid_alive",
    "reap_stale_runs",
    "resolve_baseline",
    "seed_for",
    "stale_runs",
]


@dataclass
class _Slot:
    task_dir: str
    attempt: int
    task: Task | None
    error: str | None = None
    replaces: str | None = None
    """Id of an interrupted record this slot re-runs (resume)."""


@dataclass
class RunResult:
    """A finished (or interrupted) run."""

    run: RunRecord
    rollouts: list[RolloutRecord] = field(default_factory=list, repr=False)
    runner: RolloutRunner | None = field(default=None, repr=False)


async def _to_the_end(coro: Any) -> None:
    """Await ``coro`` to its end even if the caller is cancelled (again) meanwhile."""
    fut = asyncio.ensure_future(coro)
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(fut)
    fut.result()


class Run:
    """Executes one run (new or resumed)."""

    def __init__(
        self,
        home: Home,
        meta: MetaStore,
        blobs: BlobStore,
        options: RunOptions,
        *,
        events: RunEvents | None = None,
        check_host: bool = True,
    ) -> None:
        self.home = home
        self.meta = meta
        self.blobs = blobs
        self.options = options
        self.events = events or RunEvents()
        self.check_host = check_host
        self._runners: dict[str, RolloutRunner] = {}
        self._groups: dict[str, asyncio.Future[str]] = {}
        self._baselines: dict[str, str | Exception] = {}
        self.records: list[RolloutRecord] = []
        self.choice: BackendChoice | None = None
        self.agent: Agent | None = None
        self.run: RunRecord | None = None
        self._tasks: list[tuple[str, Task | None, str | None]] | None = None
        self.stoppable = True
        """False once every rollout is final: a signal then no longer interrupts the run."""
        self.completed = False
        """True once the run is closed (its record final)."""

    # ------------------------------------------------------------------ setup

    def start_new(self) -> RunRecord:
        """Validate the options, choose the backend, create the run record."""
        self.options.validate()
        self.agent = parse_agent(self.options.agent)
        check_size(
            sum(self._attempts(t) for _, t, _ in self._load_tasks()), self.options.max_rollouts
        )
        self.choice = choose_backend(self.options.backend, self.home)
        run = RunRecord(
            id=new_id("run"),
            args=self.options.to_args(),
            task_dirs=list(self.options.task_dirs),
            agent=self.options.agent,
            backend=self.choice.name,
            backend_reason=self.choice.reason,
            concurrency=self.options.concurrency,
            attempts=self.options.attempts or 1,
            retries=self.options.retries,
            group_from_snapshot=self.options.group_from_snapshot,
            owner_pid=os.getpid(),
            host=socket.gethostname(),
            rollbox_version=__version__,
        )
        self.meta.create_run(run)
        self.run = run
        return run

    def start_resume(self, ref: str) -> RunRecord:
        """Take over a stored run: mark what its dead process left as interrupted."""
        reap_stale_runs(self.meta, self.blobs)
        run = self.meta.resolve_run(ref)
        if run.status == "running" and pid_alive(run.owner_pid) and run.owner_pid != os.getpid():
            raise InvalidInputError(
                f"run {run.id} is still running (pid {run.owner_pid})", hint="wait or kill it"
            )
        self.options = RunOptions.from_args(run.args)
        self.agent = parse_agent(self.options.agent)
        self.choice = BackendChoice(run.backend, run.backend_reason or "recorded")
        run.status = "running"
        run.owner_pid = os.getpid()
        run.finished_at = None
        self.meta.update_run(run)
        self.run = run
        return run

    def _runner(self, backend: str) -> RolloutRunner:
        r = self._runners.get(backend)
        if r is None:
            assert self.run is not None
            r = RolloutRunner(
                self.home,
                self.meta,
                self.blobs,
                run_id=self.run.id,
                backend=backend,
                on_update=self.events.on_rollout,
            )
            self._runners[backend] = r
        return r

    def _load_tasks(self) -> list[tuple[str, Task | None, str | None]]:
        """(absolute path, task or None, load error) per task directory (loaded once)."""
        if self._tasks is None:
            tasks: list[tuple[str, Task | None, str | None]] = []
            for d in self.options.task_dirs:
                try:
                    tasks.append((str(Path(d).absolute()), load_task(d), None))
                except TaskError as exc:
                    tasks.append((str(Path(d).absolute()), None, exc.one_line()))
            self._tasks = tasks
        return self._tasks

    def _slots(self, existing: list[RolloutRecord]) -> Iterator[_Slot]:
        """The slots still to run, produced lazily (attempt-major, as before)."""
        tasks = self._load_tasks()
        by_slot: dict[tuple[str, int], list[RolloutRecord]] = {}
        for rec in existing:
            by_slot.setdefault((rec.task_path, rec.attempt), []).append(rec)
        max_k = max((self._attempts(t) for _, t, _ in tasks), default=1)
        for attempt in range(max_k):
            for path, task, err in tasks:
                if attempt >= self._attempts(task):
                    continue
                recs = by_slot.get((path, attempt), [])
                if any(r.status in FINAL and r.retried_by is None for r in recs):
                    continue
                pending = [r for r in recs if r.retried_by is None]
                yield _Slot(path, attempt, task, err, replaces=pending[-1].id if pending else None)

    def _attempts(self, task: Task | None) -> int:
        if self.options.attempts is not None:
            return self.options.attempts
        if task is not None and task.rollbox.attempts is not None:
            return task.rollbox.attempts
        return 1

    def _backend_for(self, task: Task) -> str:
        assert self.choice is not None
        if self.options.backend == "auto" and task.rollbox.backend:
            return task.rollbox.backend
        return self.choice.name

    # ------------------------------------------------------------------ execution

    async def execute(self) -> RunResult:
        """Run every pending slot; returns when all are final or the run is cancelled."""
        assert self.run is not None
        run = self.run
        # Backends run their blocking steps (mounts, spawning the runtime, file copies) in the
        # loop's default executor; asyncio's default (cpus + 4 threads) would cap the run's
        # real concurrency below --concurrency.
        asyncio.get_running_loop().set_default_executor(executor_for(self.options.concurrency))
        reap_stale_runs(self.meta, self.blobs)
        existing = await asyncio.to_thread(self.meta.rollouts_of, run.id)
        total = sum(1 for _ in self._slots(existing))
        # Baselines first (a Dockerfile build or the default bootstrap can take a while):
        # that is preparation, not queue time of the rollouts.
        for _path, task, _err in self._load_tasks():
            if task is None:
                continue
            try:
                await self._baseline(task)
            except RollboxError:
                pass  # recorded; each of the task's slots reports it as a failed rollout
        if self.events.on_start:
            self.events.on_start(run, total)
        before = HostState.capture(self.home.sandboxes) if self.check_host else None
        queued_at = utcnow()
        status = "done"
        try:
            await run_pool(
                self._slots(existing),
                lambda slot: self._slot(slot, queued_at),
                self.options.concurrency,
            )
        except BaseException as exc:
            status = "interrupted"
            if not isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                status = "failed"
            await _to_the_end(self._close(run, status, before))
            raise
        # Every rollout is final: from here on a signal does not interrupt the run.
        self.stoppable = False
        await _to_the_end(self._close(run, status, before))
        self.completed = True
        return RunResult(run=self.run, rollouts=self.records)

    async def _close(self, run: RunRecord, status: str, before: HostState | None) -> None:
        from rollbox.rollouts.report import summarize
        from rollbox.store.provenance import finalize_run

        cleanup: dict[str, Any] | None = None
        if before is not None:
            after = HostState.capture(self.home.sandboxes)
            ids = {s for r in self.records for s in r.sandbox_ids}
            left = _leftovers(before, after, self.home, ids)
            cleanup = {"ok": not left, "leftovers": left}

        for runner in self._runners.values():
            runner.close()

        def work() -> RunRecord:
            run.status = status  # type: ignore[assignment]
            run.finished_at = utcnow()
            records = self.meta.rollouts_of(run.id)
            summary = summarize(run, records, cleanup)
            run.summary = {**summary.model_dump(mode="json"), "cleanup": cleanup}
            self.meta.update_run(run)
            try:
                return finalize_run(self.meta, run)
            except RollboxError:
                return run

        self.run = await asyncio.to_thread(work)

    async def _slot(self, slot: _Slot, queued_at: Any) -> None:
        if slot.task is None or slot.error is not None:
            await self._record_load_failure(slot, queued_at)
            return
        task = slot.task
        assert self.agent is not None and self.run is not None
        runner = self._runner(self._backend_for(task))
        retry_of = slot.replaces
        previous: RolloutRecord | None = None
        if retry_of is not None:
            previous = await asyncio.to_thread(self.meta.get_rollout, retry_of)
        for n in range(self.options.retries + 1):
            plan = await self._plan(slot, task, runner, queued_at, retry_of)
            if isinstance(plan, RolloutRecord):
                rec = plan
            else:
                if previous is not None:
                    plan.extra["retry_reason"] = previous.error or previous.status
                rec = await runner.run(plan)
            if previous is not None:
                await self._link(previous, rec.id)
            self.records.append(rec)
            if not blame.retryable(rec) or n == self.options.retries:
                return
            previous, retry_of, queued_at = rec, rec.id, utcnow()

    async def _link(self, previous: RolloutRecord, new_id_: str) -> None:
        from rollbox.store.provenance import seal

        def work() -> None:
            prev = self.meta.get_rollout(previous.id)
            prev.retried_by = new_id_
            self.meta.save_rollout(seal(prev, self.blobs))

        await asyncio.to_thread(work)
        previous.retried_by = new_id_

    async def _baseline(self, task: Task) -> str:
        key = task.digest
        if key not in self._baselines:
            try:
                self._baselines[key] = await asyncio.to_thread(resolve_baseline, task, self.home)
            except RollboxError as exc:
                self._baselines[key] = exc
        value = self._baselines[key]
        if isinstance(value, Exception):
            raise value
        return value

    async def _plan(
        self,
        slot: _Slot,
        task: Task,
        runner: RolloutRunner,
        queued_at: Any,
        retry_of: str | None,
    ) -> RolloutPlan | RolloutRecord:
        """The plan of a slot, or a failed record when its baseline cannot be had."""
        assert self.agent is not None and self.run is not None
        try:
            baseline = await self._baseline(task)
        except RollboxError as exc:
            return await self._failed_record(
                slot, queued_at, f"baseline: {exc.one_line()}", retry_of, task
            )
        plan = RolloutPlan(
            task=task,
            attempt=slot.attempt,
            agent=self.agent,
            baseline=baseline,
            seed=seed_for(self.run.id, task.digest, slot.attempt, self.options.seed),
            queued_at=queued_at,
            retry_of=retry_of,
        )
        if self.options.group_from_snapshot or task.rollbox.group_mode == "snapshot":
            try:
                plan.baseline = await self._group_baseline(task, runner, baseline)
            except RollboxError as exc:
                from rollbox.errors import BackendError

                status = "infra_error" if isinstance(exc, BackendError) else "failed"
                return await self._failed_record(
                    slot, queued_at, f"group setup: {exc.one_line()}", retry_of, task, status
                )
            plan.group_id = f"grp-{task.digest[7:19]}-{self.run.id[-8:]}"
            plan.setup_in_baseline = True
            plan.extra["group_parent_baseline"] = baseline
        return plan

    async def _group_baseline(self, task: Task, runner: RolloutRunner, baseline: str) -> str:
        """Set the task up once, snapshot it, share the snapshot among its attempts."""
        fut = self._groups.get(task.digest)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = asyncio.get_running_loop().create_future()
            self._groups[task.digest] = fut
            try:
                fut.set_result(await self._make_group(task, runner, baseline))
            except asyncio.CancelledError:
                fut.cancel()
                raise
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: the waiting attempts report it themselves
                raise
        return await asyncio.shield(fut)

    async def _make_group(self, task: Task, runner: RolloutRunner, baseline: str) -> str:
        from rollbox.rollouts.agents import INSTRUCTION_PATH
        from rollbox.sandbox import AsyncSandbox

        sbx = await AsyncSandbox.create(
            baseline,
            backend=runner.backend,
            limits=task.limits(),
            network=task.network(),
            env=dict(task.environment.env),
            labels={"rollbox.run": runner.run_id, "rollbox.group": task.name},
            ttl=600,
            workdir=task.environment.workdir,
            home=self.home,
        )
        try:
            await sbx.files.write(INSTRUCTION_PATH, task.instruction)
            return await sbx.snapshot(name=None)
        finally:
            await asyncio.shield(sbx.destroy())

    async def _failed_record(
        self,
        slot: _Slot,
        queued_at: Any,
        error: str,
        retry_of: str | None,
        task: Task | None = None,
        status: str = "failed",
    ) -> RolloutRecord:
        from rollbox.store.provenance import seal

        assert self.run is not None and self.agent is not None
        digest = task.digest if task is not None else ""
        if task is None:
            try:
                digest = task_digest(Path(slot.task_dir))
            except (RollboxError, OSError):
                digest = ""
        now = utcnow()
        rec = RolloutRecord(
            id=new_id("ro"),
            run_id=self.run.id,
            task_name=task.name if task is not None else Path(slot.task_dir).name,
            task_digest=digest,
            task_path=slot.task_dir,
            attempt=slot.attempt,
            agent=self.agent.spec,
            agent_config=self.agent.identity(),
            backend=self.run.backend,
            host=socket.gethostname(),
            rollbox_version=__version__,
            phases=[PhaseStamp(phase="queued", at=queued_at), PhaseStamp(phase="failed", at=now)],
            status=status,  # type: ignore[arg-type]
            error=error,
            error_kind="task" if status == "failed" else "infra",
            retry_of=retry_of,
            finished_at=now,
        )
        if status == "infra_error":
            rec.phases = [rec.phases[0], PhaseStamp(phase="infra_error", at=now)]
        sealed = seal(rec, self.blobs)
        await asyncio.to_thread(self.meta.save_rollout, sealed)
        if self.events.on_rollout:
            self.events.on_rollout(sealed)
        return sealed

    async def _record_load_failure(self, slot: _Slot, queued_at: Any) -> None:
        rec = await self._failed_record(
            slot, queued_at, slot.error or "task could not be loaded", slot.replaces
        )
        if slot.replaces is not None:
            await self._link(await asyncio.to_thread(self.meta.get_rollout, slot.replaces), rec.id)
        self.records.append(rec)
