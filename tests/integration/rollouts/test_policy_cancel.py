"""A Python policy cancelled by its agent timeout: the exec it was awaiting is killed with
its process tree, so nothing the cancelled command started keeps running into the verifier
(issue 15, item 2). Before, only an exec's own ``TimeoutError`` killed the tree."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rollbox.models import RolloutRecord

from .conftest import Runs

Leaks = Callable[[list[RolloutRecord]], dict[str, list[str]]]

pytestmark = pytest.mark.root

POLICY = """
async def act(sbx, instruction):
    # never returns on its own: the agent timeout cancels this exec
    await sbx.exec(["sh", "-c", "while true; do echo x >> /tmp/spam; sleep 0.05; done"])
"""
# reward 1 only when /tmp/spam exists and has stopped growing
TEST = """
a=$(wc -c < /tmp/spam); sleep 0.8; b=$(wc -c < /tmp/spam)
if [ "${a:-0}" -gt 0 ] && [ "$a" = "$b" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", "kill-removed"])
def test_policy_timeout_kills_the_awaited_exec_tree(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: Leaks, broken: bool
) -> None:
    if broken:  # the check must be able to fail: without the kill, the loop outlives it

        async def no_kill(_xcg: object) -> None:
            return None

        monkeypatch.setattr("rollbox.backends.namespace.sandbox._shielded_kill", no_kill)
    (tmp_path / "spammy_policy_i15.py").write_text(POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    t = runs.task("spam", test=TEST, toml="[agent]\ntimeout_sec = 1.5\n")
    try:
        _run, (rec,) = runs.run([t], agent="python:spammy_policy_i15:act", retries=0)
    finally:
        sys.modules.pop("spammy_policy_i15", None)
    assert rec.agent_timed_out and rec.error_kind == "agent", rec.error
    assert rec.verifier is not None and rec.verifier.error is None, rec.verifier
    if broken:
        assert rec.verifier.reward == 0.0
        return
    assert rec.verifier.reward == 1.0, "the cancelled exec's loop kept writing /tmp/spam"
    assert no_leaks([rec]) == {}
