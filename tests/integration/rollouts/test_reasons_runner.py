"""Limit reasons through the runner, on real namespace and gVisor sandboxes: an agent that
hogs memory (memory_mb=64), forks past pids=32, fills a disk_mb=16 upper, or outlives a
sandbox TTL of a few seconds. Each rollout records its reason (reached in the agent phase),
is never retried (retries=2 here) and is never blamed on the task or the infrastructure; the
reasons are covered by the provenance digest and shown by ``rollout show`` and the export."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollbox.cli.main import app
from rollbox.models import Limits, RolloutRecord
from rollbox.rollouts import runner as runner_mod
from rollbox.rollouts.tasks import Task
from rollbox.store.provenance import check

from .conftest import Runs

pytestmark = [pytest.mark.root, pytest.mark.slow]

BACKENDS = ["namespace", "gvisor"]

HOG = "python3 -c 'b=[]\nwhile True: b.append(bytearray(1 << 20))'"
FORKS = "for i in $(seq 64); do sleep 3 & done; wait; echo forked"
FILL = "dd if=/dev/zero of=/tmp/fill bs=1M count=64; echo filled"
# the verifier passes only when the agent finished its work
TEST = "if [ -f /tmp/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt"


def _not_blamed_elsewhere(recs: list[RolloutRecord], reason: str) -> RolloutRecord:
    assert len(recs) == 1, [(r.status, r.error) for r in recs]  # never retried
    (rec,) = recs
    assert rec.retried_by is None and rec.retry_of is None
    assert rec.status in ("done", "failed"), (rec.status, rec.error)
    assert rec.error_kind in (None, "agent"), (rec.error_kind, rec.error)
    assert reason in rec.reasons, (rec.reasons, rec.error)
    assert rec.reason_phases[reason] == "agent"
    return rec


def _show_and_export(runs: Runs, rec: RolloutRecord, tmp_path: Path) -> None:
    cli = CliRunner()
    out = cli.invoke(app, ["rollout", "show", rec.id, "--db", runs.db_url])
    assert out.exit_code == 0, out.output
    assert "reasons" in out.output and rec.reasons[0] in out.output
    dest = tmp_path / "export.jsonl"
    out = cli.invoke(app, ["export", rec.run_id, "-o", str(dest), "--db", runs.db_url])
    assert out.exit_code == 0, out.output
    (line,) = [json.loads(x) for x in dest.read_text().splitlines()]
    assert line["reasons"] == rec.reasons and line["record"]["reasons"] == rec.reasons
    assert check(rec, runs.blobs) == []  # sealed with its reasons
    out = cli.invoke(app, ["report", rec.run_id, "--db", runs.db_url, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["platform"]["limits_reached"] == {rec.reasons[0]: 1}
    out = cli.invoke(app, ["report", rec.run_id, "--db", runs.db_url])
    assert "limits reached" in out.output and f"{rec.reasons[0]} 1" in out.output


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_hog_is_the_agents(runs: Runs, backend: str, tmp_path: Path) -> None:
    t = runs.task(
        f"hog-{backend}",
        toml="[environment]\nmemory_mb = 64\n",
        solve=f"{HOG} && touch /tmp/done",
        test=TEST,
    )
    _run, recs = runs.run([t], agent="oracle", backend_override=backend, retries=2)
    rec = _not_blamed_elsewhere(recs, "oom_killed")
    if backend == "gvisor":
        # gVisor's sandbox dies with the hog: no verifier, the agent is to blame
        assert rec.status == "failed" and rec.error_kind == "agent", rec.error
        assert (
            rec.error is not None and "OOM-killed at its memory limit (memory_mb=64)" in rec.error
        )
    else:
        assert rec.exit_codes["agent"] == 137
        assert rec.status == "done" and rec.verifier is not None and rec.verifier.reward == 0
    _show_and_export(runs, rec, tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_limit_is_the_agents(
    runs: Runs, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # task.toml has no pids setting (Harbor has none): give the task's sandbox pids=32
    limits = Task.limits
    monkeypatch.setattr(Task, "limits", lambda self: limits(self).model_copy(update={"pids": 32}))
    # The forks run in a subshell and touch is retried: a shell whose fork failed at the
    # limit may give up, and the sleepers still hold the pids for a moment under load.
    t = runs.task(
        f"forks-{backend}", solve=f"({FORKS})\nuntil touch /tmp/done; do :; done", test=TEST
    )
    _run, recs = runs.run([t], agent="oracle", backend_override=backend, retries=2)
    rec = _not_blamed_elsewhere(recs, "pids_exhausted")
    assert rec.limits == Limits(pids=32)
    assert rec.status == "done" and rec.verifier is not None and rec.verifier.passed


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_disk_is_the_agents(runs: Runs, backend: str, tmp_path: Path) -> None:
    t = runs.task(
        f"fill-{backend}",
        toml="[environment]\nstorage_mb = 16\n",
        solve=f"{FILL}\ntouch /tmp/done",
        test=TEST,
    )
    _run, recs = runs.run([t], agent="oracle", backend_override=backend, retries=2)
    rec = _not_blamed_elsewhere(recs, "disk_full")
    if rec.status == "failed":  # e.g. no room left for the tests or the reward
        assert rec.error_kind == "agent" and rec.error is not None
        assert "filled the sandbox's disk (disk_mb=16)" in rec.error
    _show_and_export(runs, rec, tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ttl_expiry_is_named_and_the_agents(
    runs: Runs, backend: str, monkeypatch: pytest.MonkeyPatch, no_leaks: Callable[..., object]
) -> None:
    # the runner gives a sandbox the agent's + verifier's timeouts + a margin as TTL: shrink
    # the margin so the TTL is 4 s while the agent sleeps for a minute
    monkeypatch.setattr(runner_mod, "TTL_MARGIN_S", 4.0 - 60.0 - 60.0)
    toml = "[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n"
    t = runs.task(f"ttl-{backend}", toml=toml, solve="sleep 60\ntouch /tmp/done", test=TEST)
    _run, recs = runs.run([t], agent="oracle", backend_override=backend, retries=2)
    rec = _not_blamed_elsewhere(recs, "ttl_expired")
    assert rec.status == "failed" and rec.error_kind == "agent"
    assert rec.error is not None and "reached its TTL of 4 s" in rec.error, rec.error
    assert "connection broke" not in rec.error
    assert no_leaks(recs) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_policys_own_execs_count(
    runs: Runs, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python policy drives the sandbox itself: the limits its execs reach are recorded
    (the runner reads them from the sandbox handle), and on gVisor the policy's next call on
    the sandbox the hog took down is the agent's failure, not an infrastructure retry."""
    (tmp_path / "hog_policy_i15.py").write_text(
        f"""
async def act(sbx, instruction):
    r = await sbx.exec(["bash", "-c", {HOG!r}], timeout=60)
    await sbx.exec("touch /tmp/done")
    return [{{"action": "hog", "observation": r.exit_code, "started_at": "2026-01-01T00:00:00Z"}}]
"""
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    t = runs.task(f"policy-hog-{backend}", toml="[environment]\nmemory_mb = 64\n", test=TEST)
    _run, recs = runs.run(
        [t], agent="python:hog_policy_i15:act", backend_override=backend, retries=2
    )
    rec = _not_blamed_elsewhere(recs, "oom_killed")
    if backend == "gvisor":
        assert rec.status == "failed" and rec.error_kind == "agent", rec.error
    else:
        assert rec.status == "done" and rec.verifier is not None and rec.verifier.passed
