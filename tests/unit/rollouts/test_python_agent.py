"""Python policies: trajectories, timeouts, exceptions (a stand-in sandbox records the calls)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from rollbox.errors import SandboxCrashedError
from rollbox.models import ExecResult
from rollbox.rollouts.agents import AgentContext, PythonAgent, Trajectory, parse_agent
from rollbox.rollouts.tasks import load_task


class FakeSandbox:
    """Only what a policy touches; every exec answers exit 0 with the command echoed."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
        self.calls.append(cmd)
        return ExecResult(exit_code=0, stdout=f"ran {cmd}\n", stderr="", duration_s=0.001)


POLICIES = """
import asyncio
from rollbox.rollouts.agents import Trajectory
from rollbox.errors import SandboxCrashedError

async def good(sbx, instruction):
    t = Trajectory(sbx)
    await t.exec("ls /app")
    t.note("think", {"tokens": 3})
    return t

def sync_list(sbx, instruction):
    return [{"action": "noop", "started_at": "2026-01-01T00:00:00Z"}]

async def slow(sbx, instruction):
    await asyncio.sleep(30)

async def boom(sbx, instruction):
    raise RuntimeError("model server said no")

async def bad_return(sbx, instruction):
    return 42

async def crash(sbx, instruction):
    raise SandboxCrashedError("runtime died")
"""


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AgentContext:
    (tmp_path / "pol_d2_unit.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    task_dir = tmp_path / "task"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "instruction.md").write_text("do it\n")
    sbx: Any = FakeSandbox()
    yield AgentContext(sandbox=sbx, task=load_task(task_dir), timeout=0.5)
    sys.modules.pop("pol_d2_unit", None)


def _agent(name: str) -> PythonAgent:
    agent = parse_agent(f"python:pol_d2_unit:{name}")
    assert isinstance(agent, PythonAgent)
    return agent


def test_trajectory_recorded(ctx: AgentContext) -> None:
    out = asyncio.run(_agent("good").run(ctx))
    assert out.error is None and out.trajectory is not None
    assert [s["action"] for s in out.trajectory] == ["ls /app", "think"]
    assert out.trajectory[0]["observation"]["stdout"] == "ran ls /app\n"
    assert out.trajectory[1]["observation"] == {"tokens": 3}


def test_sync_policy_and_plain_list(ctx: AgentContext) -> None:
    out = asyncio.run(_agent("sync_list").run(ctx))
    assert out.trajectory == [{"action": "noop", "started_at": "2026-01-01T00:00:00Z"}]


def test_timeout_is_enforced(ctx: AgentContext) -> None:
    out = asyncio.run(_agent("slow").run(ctx))
    assert out.timed_out and out.error == "agent timed out after 0.5s"


@pytest.mark.parametrize(
    ("name", "needle"),
    [("boom", "RuntimeError: model server said no"), ("bad_return", "list of steps")],
)
def test_policy_failures_are_agent_errors(ctx: AgentContext, name: str, needle: str) -> None:
    out = asyncio.run(_agent(name).run(ctx))
    assert out.error is not None and needle in out.error and not out.timed_out


def test_backend_errors_are_not_the_agents_fault(ctx: AgentContext) -> None:
    with pytest.raises(SandboxCrashedError):
        asyncio.run(_agent("crash").run(ctx))


def test_trajectory_helper_direct() -> None:
    sbx: Any = FakeSandbox()
    t = Trajectory(sbx)
    asyncio.run(t.exec(["echo", "hi"]))
    assert t.steps[0]["action"] == "echo hi" and sbx.calls == [["echo", "hi"]]
