"""Agents: what acts in a rollout.

* ``oracle`` — runs the task's ``solution/solve.sh`` (uploaded to ``/solution``);
* ``nop`` — does nothing (the verifier sees the untouched baseline);
* ``cmd:<command>`` — any command of the baseline, run with ``/bin/sh -c``; the instruction is
  in ``/task/instruction.md`` and in ``$ROLLBOX_INSTRUCTION``;
* ``python:<module>:<callable>`` — a policy driving the sandbox from outside, the way an RL
  trainer's policy does: ``await policy(sandbox, instruction)`` with an
  :class:`~rollbox.sandbox.AsyncSandbox` (and ``seed=`` when it takes that keyword); it may
  return a trajectory (a list of steps, each a
  dict with ``action``, ``observation``, ``started_at``, ``ended_at`` and anything else), or use
  :class:`Trajectory` to record one while it drives the sandbox.

The agent timeout (``[agent] timeout_sec``) is enforced for all of them: an exec is killed with
its whole process tree, a Python policy is cancelled.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.errors import ExecTimeoutError, UnknownAgentError
from rollbox.models import ExecResult, utcnow
from rollbox.rollouts.tasks import Task
from rollbox.sandbox import AsyncSandbox

INSTRUCTION_PATH = "/task/instruction.md"
SOLUTION_DIR = "/solution"


@dataclass
class AgentOutcome:
    """What an agent phase produced."""

    exit_code: int | None = None
    """Exit status of the agent command (``None`` for ``nop`` and Python policies)."""
    stdout: str = ""
    """Captured stdout (capped by the sandbox's output limit)."""
    stderr: str = ""
    """Captured stderr."""
    trajectory: list[dict[str, Any]] | None = None
    """Steps of a Python policy (or of a ``cmd`` agent: one step)."""
    timed_out: bool = False
    """The agent ran past its timeout and was stopped."""
    truncated: bool = False
    """stdout or stderr was cut at the sandbox's output cap."""
    error: str | None = None
    """Why the agent failed (timeout, exception of a policy), if it did."""


@dataclass
class AgentContext:
    """What an agent gets."""

    sandbox: AsyncSandbox
    task: Task
    timeout: float
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    """The rollout's seed: ``$ROLLBOX_SEED`` for commands, ``seed=`` for policies taking it."""


class Agent(abc.ABC):
    """One kind of agent."""

    spec: str
    """The spec it was parsed from (``oracle``, ``cmd:...``)."""

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """Name and config (with a hash) recorded in every rollout."""

    @abc.abstractmethod
    async def run(self, ctx: AgentContext) -> AgentOutcome:
        """Act in ``ctx.sandbox``; never raises for the agent's own failures (they are
        in the outcome), only for infrastructure errors (``BackendError``)."""


def _hash(obj: object) -> str:
    data = json.dumps(obj, sort_keys=True, default=str).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def _exec_agent(
    ctx: AgentContext, cmd: list[str] | str, *, step_action: str | None = None
) -> AgentOutcome:
    started = utcnow()
    try:
        r: ExecResult = await ctx.sandbox.exec(
            cmd, cwd=ctx.workdir, env=ctx.env, timeout=ctx.timeout
        )
    except ExecTimeoutError as exc:
        return AgentOutcome(
            exit_code=None,
            stdout=exc.stdout,
            stderr=exc.stderr,
            timed_out=True,
            error=f"agent timed out after {ctx.timeout:g}s",
        )
    out = AgentOutcome(
        exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr, truncated=r.truncated
    )
    if step_action is not None:
        out.trajectory = [
            {
                "action": step_action,
                "observation": {"exit_code": r.exit_code, "stdout": r.stdout[-4096:]},
                "started_at": started.isoformat(),
                "ended_at": utcnow().isoformat(),
            }
        ]
    return out


class NopAgent(Agent):
    """Does nothing."""

    spec = "nop"

    def identity(self) -> dict[str, Any]:
        return {"name": "nop", "config": {}, "config_hash": _hash({"name": "nop"})}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        return AgentOutcome()


class OracleAgent(Agent):
    """Runs the task's ``solution/solve.sh``."""

    spec = "oracle"

    def identity(self) -> dict[str, Any]:
        return {"name": "oracle", "config": {}, "config_hash": _hash({"name": "oracle"})}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        solve = ctx.task.solution_dir / "solve.sh"
        if not solve.is_file():
            return AgentOutcome(error=f"oracle: task {ctx.task.name} has no solution/solve.sh")
        await ctx.sandbox.files.upload(ctx.task.solution_dir, SOLUTION_DIR)
        return await _exec_agent(ctx, ["bash", f"{SOLUTION_DIR}/solve.sh"])


class CmdAgent(Agent):
    """Runs a command of the baseline with the instruction in a file and an env var."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.spec = f"cmd:{command}"

    def identity(self) -> dict[str, Any]:
        cfg = {"command": self.command}
        return {"name": "cmd", "config": cfg, "config_hash": _hash({"name": "cmd", **cfg})}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        ctx.env = {
            **ctx.env,
            "ROLLBOX_INSTRUCTION": ctx.task.instruction,
            "ROLLBOX_INSTRUCTION_FILE": INSTRUCTION_PATH,
        }
        return await _exec_agent(ctx, self.command, step_action=self.command)


class Trajectory:
    """Records a policy's steps while it drives a sandbox.

    ::

        async def policy(sbx, instruction):
            t = Trajectory(sbx)
            await t.exec("ls /app")
            return t.steps
    """

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sandbox = sandbox
        self.steps: list[dict[str, Any]] = []

    async def exec(self, cmd: list[str] | str, **kwargs: Any) -> ExecResult:
        """Run ``cmd`` and record it as a step (action: the command, observation: result)."""
        started = utcnow()
        r = await self.sandbox.exec(cmd, **kwargs)
        self.steps.append(
            {
                "action": cmd if isinstance(cmd, str) else " ".join(cmd),
                "observation": {
                    "exit_code": r.exit_code,
                    "stdout": r.stdout[-4096:],
                    "stderr": r.stderr[-4096:],
                },
                "started_at": started.isoformat(),
                "ended_at": utcnow().isoformat(),
            }
        )
        return r

    def note(self, action: str, observation: object) -> None:
        """Record a step that is not an exec (a model call, a file read...)."""
        now = utcnow().isoformat()
        self.steps.append(
            {"action": action, "observation": observation, "started_at": now, "ended_at": now}
        )


Policy = Callable[[AsyncSandbox, str], Awaitable[Any] | Any]


def _normalise_trajectory(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if isinstance(value, Trajectory):
        value = value.steps
    if isinstance(value, dict) and "steps" in value:
        value = value["steps"]
    if not isinstance(value, list | tuple):
        raise TypeError(f"a policy must return a list of steps or None, got {type(value).__name__}")
    steps: list[dict[str, Any]] = []
    for i, step in enumerate(value):
        if hasattr(step, "model_dump"):
            step = step.model_dump(mode="json")
        if not isinstance(step, dict) or "action" not in step:
            raise TypeError(f"trajectory step {i} must be a dict with an 'action'")
        steps.append(json.loads(json.dumps(step, default=str)))
    return steps


class PythonAgent(Agent):
    """A Python policy ``module:callable`` driving the sandbox from outside."""

    def __init__(self, module: str, attr: str, fn: Policy) -> None:
        self.module = module
        self.attr = attr
        self.fn = fn
        self.spec = f"python:{module}:{attr}"
        self._source_hash: str | None = None
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        self._takes_seed = "seed" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
        mod = importlib.import_module(module)
        src = getattr(mod, "__file__", None)
        if src and Path(src).is_file():
            self._source_hash = "sha256:" + hashlib.sha256(Path(src).read_bytes()).hexdigest()

    def identity(self) -> dict[str, Any]:
        cfg = {"module": self.module, "callable": self.attr, "source_sha256": self._source_hash}
        return {"name": "python", "config": cfg, "config_hash": _hash({"name": "python", **cfg})}

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        steps: list[dict[str, Any]] | None = None
        try:
            async with asyncio.timeout(ctx.timeout):
                if self._takes_seed:
                    result = self.fn(ctx.sandbox, ctx.task.instruction, seed=ctx.seed)  # type: ignore[call-arg]
                else:
                    result = self.fn(ctx.sandbox, ctx.task.instruction)
                if inspect.isawaitable(result):
                    result = await result
            steps = _normalise_trajectory(result)
        except TimeoutError:
            return AgentOutcome(timed_out=True, error=f"agent timed out after {ctx.timeout:g}s")
        except Exception as exc:
            from rollbox.errors import BackendError

            if isinstance(exc, BackendError):
                raise
            return AgentOutcome(error=f"policy {self.spec} raised {type(exc).__name__}: {exc}")
        return AgentOutcome(trajectory=steps)


def parse_agent(spec: str) -> Agent:
    """An agent from its spec.

    Raises:
        UnknownAgentError: not ``oracle``, ``nop``, ``cmd:<command>`` or
            ``python:<module>:<callable>`` (or the module/callable cannot be imported).
    """
    hint = "use oracle, nop, cmd:<command> or python:<module>:<callable>"
    if spec == "oracle":
        return OracleAgent()
    if spec == "nop":
        return NopAgent()
    if spec.startswith("cmd:"):
        command = spec[4:]
        if not command.strip():
            raise UnknownAgentError("agent 'cmd:' needs a command", hint="e.g. cmd:'bash run.sh'")
        return CmdAgent(command)
    if spec.startswith("python:"):
        module, sep, attr = spec[len("python:") :].rpartition(":")
        if not sep or not module or not attr:
            raise UnknownAgentError(f"bad agent {spec!r}", hint="use python:<module>:<callable>")
        try:
            mod = importlib.import_module(module)
        except Exception as exc:
            raise UnknownAgentError(
                f"agent {spec!r}: cannot import module {module!r}: {type(exc).__name__}: {exc}",
                hint="is it on PYTHONPATH?",
            ) from None
        fn = getattr(mod, attr, None)
        if not callable(fn):
            raise UnknownAgentError(f"agent {spec!r}: {module} has no callable {attr!r}")
        return PythonAgent(module, attr, fn)
    raise UnknownAgentError(f"unknown agent {spec!r}", hint=hint)
