"""SIGKILL of `rollbox run` mid-run → cleanup removes its sandboxes, the run shows
interrupted, finished records stay intact, `--resume` finishes the rest. Ctrl-C cancels clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollbox.store.provenance import check

from .conftest import Runs

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROLLBOX = str(Path(sys.executable).with_name("rollbox"))


def _env(runs: Runs) -> dict[str, str]:
    return {**os.environ, "ROLLBOX_HOME": str(runs.home.root), "ROLLBOX_DB": runs.db_url}


def _cli(runs: Runs, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLBOX, *args], env=_env(runs), capture_output=True, text=True, timeout=300
    )


def _start(runs: Runs, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ROLLBOX, "run", *args, "--backend", "namespace"],
        env=_env(runs),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(runs: Runs, cond: str, timeout: float = 120) -> str:
    """Wait until the single run has a finished rollout and a running one; its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in runs.meta.list_runs():
            statuses = [r.status for r in runs.meta.rollouts_of(run.id)]
            if cond == "mid" and "done" in statuses and "running" in statuses:
                return run.id
            if cond == "running" and "running" in statuses:
                return run.id
        time.sleep(0.2)
    raise AssertionError(f"run never reached {cond!r}")


def test_sigkill_cleanup_and_resume(runs: Runs) -> None:
    fast = runs.task("fast")
    slow = runs.task("slow", solve="sleep 4; echo done > /tmp/out.txt")
    proc = _start(runs, str(fast), str(slow), "--attempts", "3", "--concurrency", "2")
    try:
        run_id = _wait_for(runs, "mid")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = {r.id: r for r in runs.meta.rollouts_of(run_id)}
    done_before = {i: r for i, r in before.items() if r.status == "done"}
    live = [s for r in before.values() if r.status == "running" for s in r.sandbox_ids]
    assert done_before and live
    assert any((runs.home.sandboxes / s).exists() for s in live)

    out = _cli(runs, "cleanup", "--json")
    assert out.returncode == 0, out.stderr
    for sid in live:
        assert not (runs.home.sandboxes / sid).exists(), f"{sid} survived cleanup"

    assert any(line.startswith(f"run {run_id}:") for line in json.loads(out.stdout)["removed"])
    assert runs.meta.get_run(run_id).status == "interrupted"  # stored, not only shown

    shown = _cli(runs, "runs", "ls", "--json")
    assert shown.returncode == 0, shown.stderr
    assert '"interrupted"' in shown.stdout

    resumed = _cli(runs, "run", "--resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    doc = json.loads(resumed.stdout)
    assert doc["status"] == "done"

    after = runs.meta.rollouts_of(run_id)
    for rid, rec in done_before.items():  # finished records untouched
        again = runs.meta.get_rollout(rid)
        assert again.provenance_digest == rec.provenance_digest
        assert check(again, runs.blobs) == []
    final = [r for r in after if r.retried_by is None]
    slots = {(r.task_name, r.attempt) for r in final}
    assert slots == {(n, a) for n in ("fast", "slow") for a in range(3)}
    assert all(r.status == "done" for r in final), [(r.task_name, r.status, r.error) for r in final]
    interrupted = [r for r in after if r.status == "interrupted"]
    assert interrupted and all(r.retried_by for r in interrupted)
    assert runs.meta.get_run(run_id).status == "done"
    verify = _cli(runs, "verify", run_id)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_cancels_cleanly(runs: Runs, sig: signal.Signals) -> None:
    slow = runs.task("sleepy", solve="sleep 60")
    proc = _start(runs, str(slow), "--attempts", "2", "--concurrency", "2")
    try:
        run_id = _wait_for(runs, "running")
        time.sleep(1.0)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "rollbox run --resume" in err
    run = runs.meta.get_run(run_id)
    assert run.status == "interrupted"
    recs = runs.meta.rollouts_of(run_id)
    assert recs and all(r.status == "interrupted" for r in recs)
    for rec in recs:
        assert [p.phase for p in rec.phases][-2:] == ["teardown", "interrupted"]
        for sid in rec.sandbox_ids:
            assert not (runs.home.sandboxes / sid).exists(), f"{sid} left behind"
    assert run.summary["cleanup"]["ok"] is True, run.summary["cleanup"]
