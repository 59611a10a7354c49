"""``AsyncTaskEnv``: a task as a step-driven environment (reset -> step -> reward).

An episode is a rollout run by the same :class:`~rollbox.rollouts.runner.RolloutRunner`
``rollbox run`` uses: provisioning from the task's baseline, setup, then an agent phase that
waits for the caller's steps; ``submit`` (or :meth:`AsyncTaskEnv.verify`) ends the agent phase
and the runner's own verify phase (the private verifier exec, shared or separate as the task
says) produces the reward, so a reward the agent forged does not count. The sealed record, its
trajectory the env's steps, lands in a run of its own (``rollbox verify RUN`` checks it).
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox import __version__
from rollbox.config import Home
from rollbox.env.actions import Action, parse_action
from rollbox.env.errors import EnvClosedError, EpisodeDoneError, NoEpisodeError
from rollbox.errors import ExecTimeoutError, InvalidInputError, RollboxError
from rollbox.ids import new_id
from rollbox.models import RolloutRecord, RunRecord, VerifierOutcome, utcnow
from rollbox.rollouts.agents import Agent, AgentContext, AgentOutcome, _hash
from rollbox.rollouts.runner import RolloutPlan, RolloutRunner
from rollbox.rollouts.tasks import Task, load_task
from rollbox.sandbox import AsyncSandbox
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

OUTPUT_TAIL = 4096
"""Characters of stdout/stderr kept per step in the stored trajectory."""


@dataclass
class Observation:
    """What the caller sees after ``reset()`` or a step."""

    text: str
    """The instruction (after reset), a command's output, a file's content, or an error."""
    exit_code: int | None = None
    """A ``bash`` step's exit status (``None`` otherwise or when it timed out)."""
    stdout: str = ""
    """A ``bash`` step's stdout."""
    stderr: str = ""
    """A ``bash`` step's stderr."""


@dataclass
class StepResult:
    """The result of one :meth:`AsyncTaskEnv.step`."""

    observation: Observation
    """What the step produced."""
    reward: float | None = None
    """The verifier's reward: only on ``submit`` (``None`` when the verifier gave none)."""
    done: bool = False
    """The episode ended (``submit``)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Extra facts: ``timed_out``, ``error``, and on submit ``rollout_id``, ``passed``,
    ``verifier_error``."""


class _EnvAgent(Agent):
    """The agent phase of an episode: hands the sandbox to the env, then waits for the end."""

    def __init__(self, caller: str, prefix: list[dict[str, Any]] | None = None) -> None:
        self.spec = f"env:{caller}"
        self.caller = caller
        self.steps: list[dict[str, Any]] = list(prefix or [])
        self.ready: asyncio.Future[AgentContext] = asyncio.get_running_loop().create_future()
        self.finished = asyncio.Event()

    def identity(self) -> dict[str, Any]:
        cfg = {"caller": self.caller}
        return {"name": "env", "config": cfg, "config_hash": _hash({"name": "env", **cfg})}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        self.ready.set_result(ctx)
        await self.finished.wait()
        return AgentOutcome(trajectory=self.steps)


class _GivenRunner(RolloutRunner):
    """A runner whose first episode starts in a sandbox made elsewhere (a memory fork)."""

    given: AsyncSandbox | None = None

    async def _create(self, plan: RolloutPlan, rec: RolloutRecord, baseline: str) -> AsyncSandbox:
        sbx, self.given = self.given, None
        if sbx is None:
            return await super()._create(plan, rec, baseline)
        rec.sandbox_ids = [*rec.sandbox_ids, sbx.id]
        return sbx


@dataclass
class _Episode:
    agent: _EnvAgent
    runner_task: asyncio.Task[RolloutRecord]
    ctx: AgentContext
    record: RolloutRecord | None = None


class AsyncTaskEnv:
    """One task as an RL environment; one sandbox per episode.

    ::

        env = await AsyncTaskEnv.create("examples/tasks/hello-file")
        obs = await env.reset()
        await env.step("echo 'Hello, rollbox!' > /app/hello.txt")
        result = await env.step({"tool": "submit"})   # result.reward == 1.0
        await env.close()
    """

    def __init__(
        self,
        task: Task,
        home: Home,
        meta: MetaStore,
        blobs: BlobStore,
        *,
        backend: str,
        baseline: str,
        seed: int | None,
        caller: str,
        owns_meta: bool,
        setup_in_baseline: bool = False,
        prefix: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.task = task
        self.home = home
        self.meta = meta
        self.blobs = blobs
        self.backend = backend
        self.baseline = baseline
        self.seed = seed
        self.caller = caller
        self._owns_meta = owns_meta
        self._setup_in_baseline = setup_in_baseline
        self._prefix = prefix
        self._extra = extra or {}
        self.run = RunRecord(
            id=new_id("run"),
            args={"env": True, "backend": backend, "seed": seed, "caller": caller},
            task_dirs=[str(task.path)],
            agent=f"env:{caller}",
            backend=backend,
            backend_reason="requested",
            owner_pid=os.getpid(),
            host=socket.gethostname(),
            rollbox_version=__version__,
        )
        meta.create_run(self.run)
        self.runner = _GivenRunner(home, meta, blobs, run_id=self.run.id, backend=backend)
        self._episode: _Episode | None = None
        self._episodes = 0
        self._closed = False
        self.records: list[RolloutRecord] = []
        """Every finished episode's sealed record, in order."""
        self.last_observation: Observation | None = None
        """The observation of the last reset or step."""

    @classmethod
    async def create(
        cls,
        task_dir: str | Path,
        backend: str = "namespace",
        seed: int | None = None,
        db: str | None = None,
        *,
        caller: str = "python",
        home: Home | None = None,
    ) -> AsyncTaskEnv:
        """Load a Harbor task and resolve its baseline (built once from its Dockerfile).

        Args:
            task_dir: the task directory.
            backend: ``namespace``, ``gvisor`` or ``microvm``.
            seed: the episodes' seed (``$ROLLBOX_SEED`` stays unset for env steps; it is
                recorded); default 0.
            db: a metadata store URL (default: the data home's SQLite file).
            caller: recorded as the agent name ``env:<caller>``.
            home: the data home (default ``ROLLBOX_HOME``).

        Raises:
            TaskError: the directory is not a valid task.
            UnknownBackendError: no such backend.
        """
        from rollbox.backends.registry import get_backend
        from rollbox.rollouts.baseline import resolve_baseline

        home = home or Home.from_env()
        task = load_task(task_dir)
        get_backend(backend, home)  # an unknown name fails here, before any run is stored
        baseline = await asyncio.to_thread(resolve_baseline, task, home)
        meta = MetaStore(db, home=home)
        return cls(
            task,
            home,
            meta,
            BlobStore(home),
            backend=backend,
            baseline=baseline,
            seed=seed,
            caller=caller,
            owns_meta=True,
        )

    # ------------------------------------------------------------------ state checks

    def _check_open(self) -> None:
        if self._closed:
            raise EnvClosedError("this env is closed", hint="create a new one")

    def _live(self) -> _Episode:
        self._check_open()
        ep = self._episode
        if ep is None:
            raise NoEpisodeError("no episode is running", hint="call reset() first")
        if ep.record is not None:
            raise EpisodeDoneError("the episode has ended", hint="call reset() for a new one")
        return ep

    @property
    def sandbox(self) -> AsyncSandbox:
        """The running episode's sandbox.

        Raises:
            NoEpisodeError, EpisodeDoneError, EnvClosedError: no running episode.
        """
        sbx = self._live().ctx.sandbox
        assert isinstance(sbx, AsyncSandbox)
        return sbx

    @property
    def done(self) -> bool:
        """The current episode has ended (or none was started)."""
        return self._episode is None or self._episode.record is not None

    # ------------------------------------------------------------------ episodes

    async def reset(self) -> Observation:
        """Start a new episode in a fresh sandbox; the instruction is the first observation.

        A running episode is ended first: its sandbox destroyed, its record stored as
        ``interrupted``.

        Raises:
            EnvClosedError: after close().
            RollboxError: the sandbox could not be created (the record says why).
        """
        self._check_open()
        await self._abandon()
        self._episodes += 1
        agent = _EnvAgent(self.caller, self._prefix)
        plan = RolloutPlan(
            task=self.task,
            attempt=self._episodes,
            agent=agent,
            baseline=self.baseline,
            seed=self.seed or 0,
            # a memory fork's VM already has the instruction
            setup_in_baseline=self._setup_in_baseline or self.runner.given is not None,
            extra={"env_episode": self._episodes, **self._extra},
        )
        runner_task = asyncio.create_task(self.runner.run(plan))
        waiting: set[asyncio.Future[Any]] = {runner_task, agent.ready}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not agent.ready.done():  # the rollout ended before the agent phase: why is stored
            rec = runner_task.result()
            self.records.append(rec)
            raise RollboxError(
                f"episode {rec.id} could not start: {rec.error or rec.status}",
                hint=f"rollbox rollout show {rec.id}",
            )
        self._episode = _Episode(agent, runner_task, agent.ready.result())
        self.last_observation = Observation(text=self.task.instruction)
        return self.last_observation

    async def step(self, action: str | dict[str, Any]) -> StepResult:
        """Act once.

        Args:
            action: a shell command string or a tool-call dict (see
                :func:`rollbox.env.actions.parse_action`); ``{"tool": "submit"}`` ends the
                episode with the verifier's reward.

        Returns:
            The observation; on submit also the reward and ``done=True``.

        Raises:
            InvalidActionError, UnknownToolError: a malformed action (nothing was run).
            NoEpisodeError, EpisodeDoneError, EnvClosedError: no running episode.
        """
        ep = self._live()
        act = parse_action(action)
        if act.tool == "submit":
            ep.agent.steps.append(self._step_entry(act, {"submitted": True}, utcnow()))
            rec = await self._finish(ep)
            v = rec.verifier
            obs = Observation(text=f"submitted; reward {v.reward if v else None}")
            self.last_observation = obs
            info = {
                "rollout_id": rec.id,
                "status": rec.status,
                "passed": v.passed if v else None,
                "verifier_error": v.error if v else rec.error,
            }
            return StepResult(obs, reward=v.reward if v else None, done=True, info=info)
        started = utcnow()
        obs, info = await self._run_tool(ep, act)
        record: dict[str, Any] = {"text": obs.text[-OUTPUT_TAIL:]}
        if act.tool == "bash":
            record = {
                "exit_code": obs.exit_code,
                "stdout": obs.stdout[-OUTPUT_TAIL:],
                "stderr": obs.stderr[-OUTPUT_TAIL:],
            }
        ep.agent.steps.append(self._step_entry(act, {**record, **info}, started))
        self.last_observation = obs
        return StepResult(obs, info=info)

    @staticmethod
    def _step_entry(act: Action, observation: dict[str, Any], started: Any) -> dict[str, Any]:
        return {
            "action": act.describe(),
            "tool": act.tool,
            "observation": observation,
            "started_at": started.isoformat(),
            "ended_at": utcnow().isoformat(),
        }

    async def _run_tool(self, ep: _Episode, act: Action) -> tuple[Observation, dict[str, Any]]:
        sbx = ep.ctx.sandbox
        if act.tool == "bash":
            try:
                r = await sbx.exec(
                    ["bash", "-c", act.args["command"]],
                    cwd=ep.ctx.workdir,
                    timeout=self.task.agent.timeout_sec,
                )
            except ExecTimeoutError as exc:
                text = f"timed out after {self.task.agent.timeout_sec:g}s"
                obs = Observation(text=text, stdout=exc.stdout, stderr=exc.stderr)
                return obs, {"timed_out": True}
            obs = Observation(
                text=r.stdout + r.stderr, exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr
            )
            return obs, {"timed_out": False}
        # A file the agent names wrongly is the agent's business: an observation, not a raise.
        try:
            if act.tool == "write_file":
                await sbx.files.write(act.args["path"], act.args["content"])
                return Observation(text=f"wrote {act.args['path']}"), {}
            data = await sbx.files.read(act.args["path"])
        except InvalidInputError as exc:
            return Observation(text=f"error: {exc.one_line()}"), {"error": exc.one_line()}
        return Observation(text=data.decode(errors="replace")), {}

    async def _finish(self, ep: _Episode) -> RolloutRecord:
        ep.agent.finished.set()
        rec = await ep.runner_task
        ep.record = rec
        self.records.append(rec)
        return rec

    async def verify(self) -> VerifierOutcome:
        """End the episode and run the task's verifier (the same phase ``rollbox run`` runs).

        The verifier sees the final state once: in shared mode its files would otherwise
        stay visible to later steps, so verify() ends the episode like ``submit``.

        Returns:
            The verifier's outcome (reward, passed, error).

        Raises:
            NoEpisodeError, EpisodeDoneError, EnvClosedError: no running episode.
            RollboxError: the episode failed before the verifier ran (the record says why).
        """
        ep = self._live()
        ep.agent.steps.append(self._step_entry(Action("submit", {}), {"verify": True}, utcnow()))
        rec = await self._finish(ep)
        if rec.verifier is None:
            raise RollboxError(f"episode {rec.id} ended without a verifier: {rec.error}")
        return rec.verifier

    async def fork(self, n: int) -> list[AsyncTaskEnv]:
        """Branch the running episode into ``n`` new envs, each already reset.

        On ``microvm`` each branch is a memory fork of the episode's VM (processes, memory
        and files carried over); on ``namespace`` and ``gvisor`` it starts from a filesystem
        snapshot (files only: processes the episode started are not running in a branch).
        Each branch is its own episode, record and run, its trajectory starting with this
        episode's steps so far. This episode keeps running.

        Raises:
            InvalidInputError: ``n`` < 1.
            NoEpisodeError, EpisodeDoneError, EnvClosedError: no running episode.
            CapabilityError: the backend cannot snapshot.
        """
        if n < 1:
            raise InvalidInputError(f"fork(n) needs n >= 1, got {n}", hint="pass a positive n")
        ep = self._live()
        sbx = ep.ctx.sandbox
        memory = sbx.backend.capabilities.memory_snapshot
        given: list[AsyncSandbox] = []
        if memory:
            given = await sbx.fork(n)
            baseline, setup = self.baseline, self._setup_in_baseline
        else:
            baseline, setup = await sbx.snapshot(), True
        branches: list[AsyncTaskEnv] = []
        try:
            for i in range(n):
                env = AsyncTaskEnv(
                    self.task,
                    self.home,
                    MetaStore(self.meta.url, home=self.home),
                    self.blobs,
                    backend=self.backend,
                    baseline=baseline,
                    seed=self.seed,
                    caller=self.caller,
                    owns_meta=True,
                    setup_in_baseline=setup,
                    prefix=ep.agent.steps,
                    extra={
                        "env_fork_of_run": self.run.id,
                        "env_branch": i,
                        "env_fork": "memory" if memory else "filesystem",
                    },
                )
                if memory:
                    env.runner.given = given[i]
                branches.append(env)
            await asyncio.gather(*(b.reset() for b in branches))
        except BaseException:
            await asyncio.gather(*(b.close() for b in branches), return_exceptions=True)
            for g in given:  # a branch that never started still holds its forked VM
                try:
                    await g.destroy()
                except RollboxError:
                    pass
            raise
        return branches

    async def _abandon(self) -> None:
        ep = self._episode
        if ep is None or ep.record is not None:
            return
        ep.runner_task.cancel()
        try:
            await ep.runner_task
        except asyncio.CancelledError:
            pass
        self._episode = None

    async def close(self) -> None:
        """End a running episode (stored as ``interrupted``), seal the run; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._abandon()
        finally:
            self.runner.close()
            await asyncio.to_thread(self._seal)

    def _seal(self) -> None:
        from rollbox.rollouts.report import summarize
        from rollbox.store.provenance import finalize_run

        run = self.run
        run.status = "done"
        run.finished_at = utcnow()
        records = self.meta.rollouts_of(run.id)
        run.summary = summarize(run, records, None).model_dump(mode="json")
        self.meta.update_run(run)
        self.run = finalize_run(self.meta, run)
        if self._owns_meta:
            self.meta.close()

    async def __aenter__(self) -> AsyncTaskEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
