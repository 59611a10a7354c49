"""Agent specs and identities."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rollbox.errors import UnknownAgentError
from rollbox.rollouts.agents import CmdAgent, NopAgent, OracleAgent, PythonAgent, parse_agent


def test_builtin_agents() -> None:
    assert isinstance(parse_agent("oracle"), OracleAgent)
    assert isinstance(parse_agent("nop"), NopAgent)
    cmd = parse_agent("cmd:echo hi")
    assert isinstance(cmd, CmdAgent) and cmd.command == "echo hi"
    assert cmd.identity()["config"] == {"command": "echo hi"}
    assert cmd.identity()["config_hash"] != parse_agent("cmd:echo ho").identity()["config_hash"]


def test_python_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mypolicy_x1.py").write_text("async def act(sbx, instruction):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = parse_agent("python:mypolicy_x1:act")
    assert isinstance(agent, PythonAgent)
    ident = agent.identity()
    assert ident["config"]["callable"] == "act"
    assert str(ident["config"]["source_sha256"]).startswith("sha256:")
    sys.modules.pop("mypolicy_x1", None)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("gpt", "unknown agent"),
        ("cmd:", "needs a command"),
        ("python:nomodule", "python:<module>:<callable>"),
        ("python:no_such_module_zz:fn", "cannot import"),
        ("python:json:no_such_fn", "no callable"),
    ],
)
def test_unknown_agents(spec: str, needle: str) -> None:
    with pytest.raises(UnknownAgentError, match=needle) as ei:
        parse_agent(spec)
    assert ei.value.exit_code == 2
