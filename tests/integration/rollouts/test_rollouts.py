"""Real rollouts on the namespace backend: outcomes, blame, evidence, teardown."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rollbox.models import RolloutRecord
from rollbox.store.provenance import check

from .conftest import Runs

pytestmark = [pytest.mark.root, pytest.mark.slow]

Leaks = Callable[[list[RolloutRecord]], dict[str, list[str]]]


def _phases(rec: RolloutRecord) -> list[str]:
    return [p.phase for p in rec.phases]


def test_oracle_passes_nop_fails_with_diff_and_no_leaks(runs: Runs, no_leaks: Leaks) -> None:
    t = runs.task("hello", solve="mkdir -p /app && echo hi > /app/hello.txt && rm /etc/motd")
    (t / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/hello.txt)" = hi ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    run, recs = runs.run([t], agent="oracle", attempts=2, concurrency=2)
    assert run.status == "done" and len(recs) == 2
    for rec in recs:
        assert rec.status == "done", rec.error
        assert rec.verifier is not None and rec.verifier.passed and rec.verifier.reward == 1.0
        assert _phases(rec) == [
            "queued", "provisioning", "setup", "agent", "verify", "collect", "teardown", "done"
        ]  # fmt: skip
        changes = {(c.path, c.kind) for c in rec.fs_diff}
        assert ("/app/hello.txt", "added") in changes
        assert ("/etc/motd", "deleted") in changes
        assert not any(p.startswith(("/tests", "/task")) for p, _ in changes)
        hello = next(c for c in rec.fs_diff if c.path == "/app/hello.txt")
        assert hello.size == 3 and hello.sha256 is not None
        assert check(rec, runs.blobs) == []  # sealed, every blob present
        assert rec.task_blob is not None and rec.baseline_digest and rec.backend_version
    assert run.summary["cleanup"]["ok"] is True
    assert no_leaks(recs) == {}

    _, recs2 = runs.run([t], agent="nop", attempts=1)
    assert [r.status for r in recs2] == ["done"]
    assert recs2[0].verifier is not None and recs2[0].verifier.passed is False
    assert recs2[0].fs_diff == []  # nop changed nothing
    assert recs2[0].task_digest == recs[0].task_digest


def test_separate_verifier_runs_in_a_fresh_sandbox(runs: Runs, no_leaks: Leaks) -> None:
    t = runs.task(
        "sep",
        toml='[verifier]\nenvironment_mode = "separate"\n',
        # The agent leaves a process running; the fresh verifier sandbox must not have it.
        solve="echo 42 > /tmp/answer; (setsid sleep 300 >/dev/null 2>&1 &); true",
        test="""
        n=$(ls /proc | grep -c '^[0-9]')
        procs=$(ps -eo comm | grep -c '^sleep$')
        echo "sleep processes: $procs"
        if [ "$(cat /tmp/answer)" = 42 ] && [ "$procs" = 0 ]; then echo 1; else echo 0; fi \\
          > /logs/verifier/reward.txt
        """,
    )
    _, recs = runs.run([t], agent="oracle")
    (rec,) = recs
    assert rec.status == "done", rec.error
    assert rec.verifier is not None and rec.verifier.mode == "separate"
    assert rec.verifier.passed, (
        runs.blobs.get(rec.verifier.stdout.digest) if rec.verifier.stdout else ""
    )
    assert len(rec.sandbox_ids) == 2 and rec.sandbox_ids[0] != rec.sandbox_ids[1]
    assert rec.extra["verifier_baseline"] != rec.baseline_digest
    assert ("/tmp/answer", "added") in {(c.path, c.kind) for c in rec.fs_diff}
    assert no_leaks(recs) == {}


def test_artifacts_are_collected_as_blobs(runs: Runs) -> None:
    t = runs.task(
        "arts",
        toml='artifacts = ["/out", "/missing.txt"]\n',
        solve="mkdir -p /out/sub /logs/agent && echo report > /out/r.txt"
        " && echo deep > /out/sub/d.txt && echo thinking > /logs/agent/agent.log",
        test='echo \'{"reward": 1, "style": 0.5}\' > /logs/verifier/reward.json',
    )
    _, (rec,) = runs.run([t], agent="oracle")
    assert rec.status == "done", rec.error
    arts = {a.name: runs.blobs.get(a.digest) for a in rec.artifacts}
    assert arts["/out/r.txt"] == b"report\n"
    assert arts["/out/sub/d.txt"] == b"deep\n"
    assert arts["/logs/agent/agent.log"] == b"thinking\n"
    assert json.loads(arts["/logs/verifier/reward.json"])["style"] == 0.5
    assert any("/missing.txt" in m for m in rec.extra["missing_artifacts"])
    assert rec.verifier is not None and rec.verifier.rewards == {"reward": 1.0, "style": 0.5}


def test_agent_timeout_is_enforced_and_blamed_on_the_agent(runs: Runs) -> None:
    t = runs.task("slow", toml="[agent]\ntimeout_sec = 1\n")
    _, (rec,) = runs.run([t], agent="cmd:sleep 30; echo late > /tmp/out.txt")
    assert rec.status == "failed" and rec.error_kind == "agent"
    assert rec.agent_timed_out and "timed out after 1s" in (rec.error or "")
    agent_at, verify_at = rec.phase_time("agent"), rec.phase_time("verify")
    assert agent_at is not None and verify_at is not None
    assert (verify_at - agent_at).total_seconds() < 10
    # The verifier still ran (the command was killed before writing its file).
    assert rec.verifier is not None and rec.verifier.reward == 0.0


def test_verifier_without_reward_is_a_verifier_error(runs: Runs) -> None:
    t = runs.task("noreward", test="echo checked but wrote nothing; exit 3")
    run, (rec,) = runs.run([t], agent="oracle")
    assert run.status == "done"
    assert rec.status == "failed" and rec.error_kind == "verifier"
    assert "wrote no reward" in (rec.error or "") and "exited 3" in (rec.error or "")
    assert rec.verifier is not None and rec.verifier.exit_code == 3
    assert rec.verifier.stdout is not None
    assert runs.blobs.get(rec.verifier.stdout.digest) == b"checked but wrote nothing\n"


def test_bad_tasks_fail_their_rollouts_and_the_run_goes_on(runs: Runs) -> None:
    good = runs.task("good")
    broken = runs.task("broken", toml="[agent\n")
    noinstr = runs.task("noinstr")
    (noinstr / "instruction.md").unlink()
    run, recs = runs.run([broken, good, noinstr], agent="oracle")
    by = {r.task_name: r for r in recs}
    assert run.status == "done"
    assert by["good"].status == "done"
    assert by["broken"].status == "failed" and by["broken"].error_kind == "task"
    assert "not valid TOML" in (by["broken"].error or "")
    assert "instruction.md is missing" in (by["noinstr"].error or "")


def test_infra_error_is_retried_in_a_fresh_sandbox(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: Leaks
) -> None:
    marker = tmp_path / "crashed-once"
    (tmp_path / "crashy_policy_d2.py").write_text(
        f"""
from pathlib import Path

async def act(sbx, instruction):
    marker = Path({str(marker)!r})
    if not marker.exists():
        marker.write_text(sbx.id)
        await sbx.destroy()          # the sandbox dies under the agent
        await sbx.exec("true")       # -> BackendError: infrastructure, not the agent's fault
    r = await sbx.exec("echo ok > /tmp/out.txt")
    return [{{"action": "write", "observation": r.exit_code, "started_at": "2026-01-01T00:00:00Z"}}]
"""
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    t = runs.task("flaky")
    run, recs = runs.run([t], agent="python:crashy_policy_d2:act", retries=1)
    sys.modules.pop("crashy_policy_d2", None)
    assert len(recs) == 2
    first = next(r for r in recs if r.retry_of is None)
    second = next(r for r in recs if r.retry_of is not None)
    assert first.status == "infra_error" and first.error_kind == "infra"
    assert first.retried_by == second.id and second.retry_of == first.id
    assert second.status == "done" and second.verifier and second.verifier.passed
    assert set(first.sandbox_ids).isdisjoint(second.sandbox_ids)
    assert first.sandbox_ids[0] == marker.read_text()
    assert second.trajectory is not None
    steps = json.loads(runs.blobs.get(second.trajectory.digest))
    assert steps[0]["action"] == "write"
    assert check(first, runs.blobs) == [] and check(second, runs.blobs) == []
    assert run.summary["platform"]["retries"] == 1
    assert no_leaks(recs) == {}


@pytest.mark.parametrize("how", ["flag", "task.toml"])
def test_group_from_snapshot_shares_one_setup(runs: Runs, how: str) -> None:
    toml = '[rollbox]\ngroup_mode = "snapshot"\n' if how == "task.toml" else ""
    t = runs.task("grp", solve="cat /task/instruction.md > /tmp/out.txt", toml=toml)
    _, recs = runs.run(
        [t], agent="oracle", attempts=3, concurrency=3, group_from_snapshot=how == "flag"
    )
    assert len(recs) == 3 and all(r.status == "done" for r in recs), [r.error for r in recs]
    assert len({r.group_id for r in recs}) == 1 and recs[0].group_id is not None
    assert len({r.baseline_digest for r in recs}) == 1
    parent = recs[0].extra["group_parent_baseline"]
    assert recs[0].baseline_lineage[:2] == [recs[0].baseline_digest, parent]
    assert all("setup" in _phases(r) for r in recs)
    assert len({r.sandbox_ids[0] for r in recs}) == 3


def test_cmd_agent_sees_the_instruction_but_never_the_tests(runs: Runs) -> None:
    t = runs.task(
        "peek",
        test="""
        if [ "$(cat /tmp/out.txt)" = "instruction ok, no tests" ]; then echo 1; else echo 0; fi \\
          > /logs/verifier/reward.txt
        """,
    )
    cmd = (
        'cmp -s <(printf "%s" "$ROLLBOX_INSTRUCTION") /task/instruction.md'
        " && [ ! -e /tests ] && [ ! -e /solution ]"
        ' && echo "instruction ok, no tests" > /tmp/out.txt'
    )
    _, (rec,) = runs.run([t], agent=f"cmd:bash -c '{cmd}'")
    assert rec.status == "done", rec.error
    assert rec.verifier is not None and rec.verifier.passed
    assert "ROLLBOX_INSTRUCTION" in rec.env_names
    assert rec.trajectory is not None  # a cmd agent's one step is kept too


@pytest.mark.postgres
def test_run_on_postgresql(runs: Runs) -> None:
    import asyncio
    import os

    from rollbox.rollouts.runs import Run, RunOptions
    from rollbox.store.metadata import MetaStore

    from ..store.conftest import fresh_pg_database

    base = os.environ.get("ROLLBOX_TEST_PG_URL")
    if not base:
        pytest.skip("ROLLBOX_TEST_PG_URL is not set (scripts/ci-services.sh starts PostgreSQL)")
    t = runs.task("pg")
    with fresh_pg_database(base) as url:
        meta = MetaStore(url, home=runs.home)
        r = Run(runs.home, meta, runs.blobs, RunOptions([str(t)], backend="namespace", attempts=2))
        r.start_new()
        result = asyncio.run(r.execute())
        recs = meta.rollouts_of(result.run.id)
        assert result.run.status == "done" and len(recs) == 2
        assert all(x.status == "done" and x.verifier and x.verifier.passed for x in recs)
        assert all(check(x, runs.blobs) == [] for x in recs)
        assert meta.get_run(result.run.id).provenance_digest is not None
        meta.close()


def test_seed_reaches_commands_and_policies(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = runs.task("seeded", toml='artifacts = ["/tmp/out.txt"]\n')
    _, (rec,) = runs.run([t], agent="cmd:echo $ROLLBOX_SEED > /tmp/out.txt")
    (art,) = [a for a in rec.artifacts if a.name == "/tmp/out.txt"]
    assert runs.blobs.get(art.digest).decode().strip() == str(rec.seed)
    (tmp_path / "seeded_policy_d2.py").write_text(
        "async def act(sbx, instruction, *, seed):\n"
        "    await sbx.exec(f'echo {seed} > /tmp/out.txt')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _, (rec2,) = runs.run([t], agent="python:seeded_policy_d2:act")
    sys.modules.pop("seeded_policy_d2", None)
    (art2,) = [a for a in rec2.artifacts if a.name == "/tmp/out.txt"]
    assert runs.blobs.get(art2.digest).decode().strip() == str(rec2.seed)
    assert rec2.seed != rec.seed  # per run and attempt
