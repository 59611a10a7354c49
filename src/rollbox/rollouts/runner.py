"""One rollout through its phases, in a fresh sandbox, with its provenance record.

``queued → provisioning → setup → agent → verify → collect → teardown → done | failed |
infra_error | interrupted``, each stamped in the :class:`~rollbox.models.RolloutRecord`.

* **provisioning** — a fresh sandbox from the task's baseline (or its group snapshot);
* **setup** — ``/task/instruction.md`` written (skipped when the baseline is a group snapshot
  that already has it);
* **agent** — the agent acts, under ``[agent] timeout_sec``;
* **verify** — the filesystem diff of the agent's final state is taken first; then
  ``tests/`` is uploaded to ``/tests`` (never visible to the agent) and ``tests/test.sh`` run,
  in the same sandbox (``shared``) or in a fresh one created from a snapshot of the agent's
  final filesystem (``separate``), under ``[verifier] timeout_sec``; ``/logs/verifier`` is
  downloaded into the blob store and the reward read from it;
* **collect** — ``artifacts`` paths and (when the agent wrote it) ``/logs/agent``
  downloaded into the blob store;
* **teardown** — every sandbox destroyed, always: on errors and on cancellation (Ctrl-C),
  through :func:`asyncio.shield`.

The record is saved once its sandbox exists (so a killed run leaves a ``running`` record naming
the sandbox, which resume turns into ``interrupted``) and, sealed with its provenance digest, at
the end.

Blame: a :class:`~rollbox.errors.BackendError` anywhere is ``infra_error`` (retryable); bad
task content is ``failed``/``task``; agent timeout or crash is ``failed``/``agent``; no usable
reward is ``failed``/``verifier``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from rollbox import __version__
from rollbox.backends.base import Backend, SandboxHandle
from rollbox.backends.registry import get_backend
from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    CapabilityError,
    RollboxError,
)
from rollbox.ids import new_id
from rollbox.models import (
    BaselineInfo,
    BlobRef,
    PhaseStamp,
    RolloutRecord,
    SandboxSpec,
    utcnow,
)
from rollbox.rollouts import blame
from rollbox.rollouts.agents import INSTRUCTION_PATH, Agent, AgentContext, AgentOutcome
from rollbox.rollouts.diff import diff_upper, signature, upper_dir_of
from rollbox.rollouts.outputs import Timing
from rollbox.rollouts.tasks import Task, task_tar
from rollbox.rollouts.verify_phase import VerifyPhase, _Fail
from rollbox.sandbox import AsyncSandbox, create_handle
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

T = TypeVar("T")

TTL_MARGIN_S = 600.0
"""Sandboxes outlive a rollout's time budget by this much at most, even if rollbox dies."""


@dataclass
class RolloutPlan:
    """One rollout to run."""

    task: Task
    attempt: int
    agent: Agent
    baseline: str
    """Resolved baseline digest the sandbox starts from."""
    seed: int
    queued_at: datetime = field(default_factory=utcnow)
    group_id: str | None = None
    setup_in_baseline: bool = False
    """The baseline is a group snapshot taken after setup: skip setup."""
    retry_of: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class RolloutRunner(VerifyPhase):
    """Runs rollouts of one run; shared by its concurrent rollouts.

    The verify phase and the blob storage / collect phase are its bases
    (:class:`~rollbox.rollouts.verify_phase.VerifyPhase`,
    :class:`~rollbox.rollouts.outputs.RolloutOutputs`).
    """

    def __init__(
        self,
        home: Home,
        meta: MetaStore,
        blobs: BlobStore,
        *,
        run_id: str,
        backend: str,
        on_update: Callable[[RolloutRecord], None] | None = None,
    ) -> None:
        self.home = home
        self.meta = meta
        self.blobs = blobs
        self.run_id = run_id
        self.backend = backend
        self.on_update = on_update
        self.host = socket.gethostname()
        self._task_blobs: dict[str, BlobRef] = {}
        self._stored: set[str] = set()
        self._be: Backend | None = None
        self._early: dict[str, asyncio.Task[None]] = {}
        self._db_pool: ThreadPoolExecutor | None = None
        self._infos: dict[str, BaselineInfo] = {}
        self._versions: dict[str, str] = {}
        self._lineage: dict[str, list[str]] = {}
        self._lowers: dict[str, list[Path]] = {}
        self.timing: dict[str, Timing] = {}

    # ------------------------------------------------------------------ helpers

    def task_blob(self, task: Task) -> BlobRef:
        """The stored copy of a task (a deterministic tar), stored once per digest."""
        ref = self._task_blobs.get(task.digest)
        if ref is None:
            ref = self.blobs.ref("task.tar", task_tar(task.path))
            self._task_blobs[task.digest] = ref
        return ref

    def lineage(self, digest: str) -> list[str]:
        """``digest`` and its parents (self first)."""
        if digest not in self._lineage:
            from rollbox.baselines.store import BaselineStore

            store = BaselineStore(self.home)
            chain = [digest]
            cur: str | None = digest
            try:
                while cur is not None and len(chain) < 64:
                    cur = store.resolve(cur).parent
                    if cur is not None:
                        chain.append(cur)
            except RollboxError:
                pass
            self._lineage[digest] = chain
        return self._lineage[digest]

    def lowers(self, digest: str) -> list[Path]:
        """The baseline's unpacked layer directories, bottom first (cached)."""
        if digest not in self._lowers:
            from rollbox.baselines.store import BaselineStore

            self._lowers[digest] = BaselineStore(self.home).layer_dirs(digest)
        return self._lowers[digest]

    def new_record(self, plan: RolloutPlan) -> RolloutRecord:
        """The initial (queued) record of a plan."""
        task = plan.task
        names = {*task.environment.env, *task.verifier.env}
        if plan.agent.spec == "oracle" or plan.agent.spec.startswith("cmd:"):
            names.add("ROLLBOX_SEED")
        if plan.agent.spec.startswith("cmd:"):
            names |= {"ROLLBOX_INSTRUCTION", "ROLLBOX_INSTRUCTION_FILE"}
        env_names = sorted(names)
        return RolloutRecord(
            id=new_id("ro"),
            run_id=self.run_id,
            task_name=task.name,
            task_digest=task.digest,
            task_blob=self.task_blob(task),
            task_path=str(task.path),
            attempt=plan.attempt,
            agent=plan.agent.spec,
            agent_config={
                **plan.agent.identity(),
                "timeout_sec": task.agent.timeout_sec,
            },
            seed=plan.seed,
            backend=self.backend,
            host=self.host,
            rollbox_version=__version__,
            baseline_digest=plan.baseline,
            baseline_lineage=self.lineage(plan.baseline),
            limits=task.limits(),
            network=task.network(),
            env_names=env_names,
            phases=[PhaseStamp(phase="queued", at=plan.queued_at)],
            group_id=plan.group_id,
            retry_of=plan.retry_of,
            extra={
                "verifier_mode": task.verifier.environment_mode,
                "verifier_timeout_sec": task.verifier.timeout_sec,
                **({"ignored_task_keys": list(task.ignored_keys)} if task.ignored_keys else {}),
                **plan.extra,
            },
        )

    async def _create(self, plan: RolloutPlan, rec: RolloutRecord, baseline: str) -> AsyncSandbox:
        task = plan.task
        ttl = task.agent.timeout_sec + task.verifier.timeout_sec + TTL_MARGIN_S
        t0 = time.perf_counter()
        try:
            be = self._backend()
            spec = SandboxSpec(
                baseline=baseline,
                backend=self.backend,
                limits=task.limits(),
                network=task.network(),
                env=dict(task.environment.env),
                labels={"rollbox.run": self.run_id, "rollbox.rollout": rec.id},
                ttl_s=ttl,
                workdir=task.environment.workdir,
            )
            be.check(spec)

            def orphan(h: SandboxHandle) -> None:  # made while cancelled: destroyed, listed
                rec.sandbox_ids = [*rec.sandbox_ids, h.id]

            info = self._baseline_info(baseline)
            sbx = AsyncSandbox(await create_handle(be, spec, info, on_created=orphan), be)
        except BackendError as exc:
            raise _Fail("infra_error", "infra", f"provisioning failed: {exc.one_line()}") from None
        except RollboxError as exc:
            raise _Fail("failed", "task", f"sandbox refused: {exc.one_line()}") from None
        finally:
            self._time(rec).backend_s += time.perf_counter() - t0
        rec.sandbox_ids = [*rec.sandbox_ids, sbx.id]
        return sbx

    def _backend(self) -> Backend:
        """One prepared backend instance for the whole run (what ``AsyncSandbox.create``
        does per call — registry lookup, ``prepare()``, baseline resolution — done once)."""
        if self._be is None:
            be = get_backend(self.backend, self.home)
            be.prepare()
            self._be = be
        return self._be

    def _baseline_info(self, digest: str) -> BaselineInfo:
        info = self._infos.get(digest)
        if info is None:
            from rollbox.baselines.store import BaselineStore

            info = self._infos[digest] = BaselineStore(self.home).resolve(digest)
        return info

    async def _db(self, fn: Callable[[], T]) -> T:
        """Run a store call on the runner's own DB thread: SQLite writes are serialised anyway,
        and queued writes must not occupy the default pool the backends' file and create
        calls run on."""
        if self._db_pool is None:
            self._db_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollbox-db")
        return await asyncio.get_running_loop().run_in_executor(self._db_pool, fn)

    def close(self) -> None:
        """Release the DB thread (idempotent)."""
        if self._db_pool is not None:
            self._db_pool.shutdown(wait=True)
            self._db_pool = None

    async def _save(self, rec: RolloutRecord) -> None:
        await self._db(lambda: self.meta.save_rollout(rec))

    def _notify(self, rec: RolloutRecord) -> None:
        if self.on_update is not None:
            self.on_update(rec)

    # ------------------------------------------------------------------ the rollout

    async def run(self, plan: RolloutPlan) -> RolloutRecord:
        """Run one rollout to a terminal status and store its sealed record.

        Never raises for a rollout's own failures (they are in the record); re-raises
        :class:`asyncio.CancelledError` after recording ``interrupted`` and tearing down.
        """
        rec = self.new_record(plan)
        sandboxes: list[AsyncSandbox] = []
        cancelled = False
        try:
            rec.stamp("provisioning")
            rec.status = "running"
            self._notify(rec)
            await self._phases(plan, rec, sandboxes)
            rec.status = "done"
        except asyncio.CancelledError:
            cancelled = True
            rec.status = "interrupted"
            rec.error = "interrupted (run cancelled)"
            rec.error_kind = "infra"
        except _Fail as f:
            rec.status = f.status
            rec.error = f.message
            rec.error_kind = f.kind
        except Exception as exc:
            # BackendError: infra (retried); another RollboxError (a capability the task
            # needs, a path outside): the task's; anything else: an internal error that must
            # not take the whole run down -- unless a sandbox limit the agent reached is
            # behind it (see rollouts/blame.py).
            phase = blame.current_phase(rec)
            blame.note_handles(rec, (s.handle for s in sandboxes), phase)
            rec.status, rec.error_kind, rec.error = blame.classify(rec, exc, phase)
        finally:
            rec.stamp("teardown")
            await asyncio.shield(self._teardown(rec, sandboxes))
            final = rec.status if rec.status != "running" else "failed"
            rec.status = final
            rec.stamp(
                final if final in ("done", "failed", "infra_error", "interrupted") else "failed"
            )
            rec.finished_at = utcnow()
            await asyncio.shield(self._finish(rec))
            self._notify(rec)
        if cancelled:
            raise asyncio.CancelledError
        return rec

    async def _teardown(self, rec: RolloutRecord, sandboxes: list[AsyncSandbox]) -> None:
        t0 = time.perf_counter()
        for sbx in sandboxes:
            try:
                await sbx.destroy()
            except Exception as exc:
                rec.extra = {**rec.extra, "teardown_error": f"{type(exc).__name__}: {exc}"}
        self._time(rec).backend_s += time.perf_counter() - t0

    async def _finish(self, rec: RolloutRecord) -> None:
        from rollbox.store.provenance import seal

        early = self._early.pop(rec.id, None)
        if early is not None:
            try:
                await early
            except Exception as exc:  # the final save below still records the rollout
                rec.extra = {**rec.extra, "early_save_error": f"{type(exc).__name__}: {exc}"}

        def work() -> RolloutRecord:
            sealed = seal(rec, self.blobs)
            self.meta.save_rollout(sealed)
            return sealed

        sealed = await self._db(work)
        rec.provenance_digest = sealed.provenance_digest

    async def _phases(
        self, plan: RolloutPlan, rec: RolloutRecord, sandboxes: list[AsyncSandbox]
    ) -> None:
        task = plan.task
        timing = self._time(rec)
        if not (task.tests_dir / "test.sh").is_file():
            # Known before any sandbox starts: no verifier, no rollout worth running.
            raise _Fail("failed", "task", f"task {task.name} has no tests/test.sh")
        sbx = await self._create(plan, rec, plan.baseline)
        sandboxes.append(sbx)
        # Saved once the sandbox exists: a killed run leaves a "running" record naming it.
        # In the background (a snapshot of the record): the rollout does not wait for the DB;
        # _finish waits for it before the final save so the order is kept.
        self._early[rec.id] = asyncio.create_task(self._save(rec.model_copy()))
        info = sbx.info
        rec.accelerator = info.accelerator
        if self.backend not in self._versions:
            self._versions[self.backend] = info.backend_version or sbx.backend.version()
        rec.backend_version = self._versions[self.backend]
        upper = upper_dir_of(dict(info.extra), self.home.sandboxes / sbx.id)
        # A handful of lstat calls on a fresh upper dir: cheaper inline than a thread hop.
        noise = signature(upper) if upper is not None else {}

        rec.stamp("setup")
        if not plan.setup_in_baseline:
            t0 = time.perf_counter()
            await sbx.files.write(INSTRUCTION_PATH, task.instruction)
            timing.backend_s += time.perf_counter() - t0

        rec.stamp("agent")
        ctx = AgentContext(
            sandbox=sbx,
            task=task,
            timeout=task.agent.timeout_sec,
            workdir=task.environment.workdir,
            env={"ROLLBOX_SEED": str(plan.seed)},
            seed=plan.seed,
        )
        t0 = time.perf_counter()
        try:  # the limits the agent reached count even when it raised
            outcome = await plan.agent.run(ctx)
        finally:  # (see rollouts/blame.py)
            blame.note_handles(rec, [sbx.handle], blame.AGENT)
        timing.backend_s += time.perf_counter() - t0
        self._record_agent(rec, outcome)

        rec.stamp("verify")
        vsbx = sbx
        top_layer: Path | None = None
        if task.verifier.environment_mode == "separate":
            if not sbx.backend.capabilities.snapshot:
                raise CapabilityError(f"backend {self.backend!r} cannot snapshot (separate mode)")
            t0 = time.perf_counter()
            if upper is not None:
                rec.fs_diff = await asyncio.to_thread(
                    diff_upper, upper, self.lowers(plan.baseline), noise=noise
                )
            snap = await sbx.snapshot()
            await sbx.destroy()
            timing.backend_s += time.perf_counter() - t0
            rec.extra = {**rec.extra, "verifier_baseline": snap}
            if upper is None:
                top_layer = self.lowers(snap)[-1]
            vsbx = await self._create(plan, rec, snap)
            sandboxes.append(vsbx)
        elif upper is not None:
            rec.fs_diff = await asyncio.to_thread(
                diff_upper, upper, self.lowers(plan.baseline), noise=noise
            )
        else:
            # No host-side upper dir (microVM): diff the top layer of a snapshot.
            t0 = time.perf_counter()
            snap = await sbx.snapshot()
            timing.backend_s += time.perf_counter() - t0
            top_layer = self.lowers(snap)[-1]
        if top_layer is not None:
            rec.fs_diff = await asyncio.to_thread(diff_upper, top_layer, self.lowers(plan.baseline))
        await self._verify(rec, vsbx, task)
        blame.note_handles(rec, (s.handle for s in sandboxes), blame.VERIFY)

        rec.stamp("collect")
        await self._collect(rec, vsbx, task)
        if rec.agent_timed_out or (rec.error_kind == "agent" and rec.error):
            error = rec.error or "agent failed"
            raise _Fail("failed", "agent", blame.agent_failure(rec, error))
        if rec.verifier is not None and rec.verifier.error:
            raise _Fail("failed", *blame.verifier_error(rec, rec.verifier.error))

    def _record_agent(self, rec: RolloutRecord, outcome: AgentOutcome) -> None:
        cap = rec.limits.output_bytes if rec.limits else 1 << 20
        cut = outcome.truncated
        if outcome.exit_code is not None:
            rec.exit_codes = {**rec.exit_codes, "agent": outcome.exit_code}
        if outcome.stdout or outcome.exit_code is not None:
            data = outcome.stdout.encode()
            rec.stdout = self._ref("agent.stdout", data, truncated=cut or len(data) >= cap)
        if outcome.stderr or outcome.exit_code is not None:
            data = outcome.stderr.encode()
            rec.stderr = self._ref("agent.stderr", data, truncated=cut or len(data) >= cap)
        if outcome.trajectory is not None:
            import json

            data = json.dumps(outcome.trajectory, sort_keys=True).encode()
            rec.trajectory = self._ref("trajectory.json", data)
        rec.agent_timed_out = outcome.timed_out
        if outcome.error:
            rec.error = outcome.error
            rec.error_kind = "agent"
