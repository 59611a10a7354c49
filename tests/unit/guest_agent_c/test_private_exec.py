"""The C guest agent refuses private (verifier) execs in ``--fd`` test mode: on the host,
its ``kill_others`` would be ``kill(-1, SIGKILL)`` for every host process and its mounts
would land on host paths. (Inside a guest they are tested in
tests/integration/sandboxes/test_isolated_exec.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_protocol import Agent, binary  # noqa: F401  (the module-scoped fixture)


@pytest.fixture
def agent(binary: Path) -> Iterator[Agent]:  # noqa: F811
    a = Agent(binary)
    yield a
    a.sock.close()
    a.proc.kill()
    a.proc.wait()


@pytest.mark.parametrize(
    "private",
    [
        {"kill_others": True},
        {"fresh": ["/tmp/rbx-never-made"], "files": [], "collect": "", "kill_others": False},
    ],
)
def test_private_execs_are_refused_on_the_host(agent: Agent, private: dict[str, object]) -> None:
    out, err, reply = agent.run(7, argv=["true"], private=private)
    assert reply["error"]["message"] == "private execs are refused in --fd test mode"
    assert (out, err) == (b"", b"")
    assert not Path("/tmp/rbx-never-made").exists()
    # the agent is still there and runs ordinary execs
    out, _err, reply = agent.run(8, argv=["echo", "alive"])
    assert out == b"alive\n" and reply["exit_code"] == 0
