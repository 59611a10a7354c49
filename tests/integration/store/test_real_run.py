"""End to end: a real ``rollbox run`` in namespace sandboxes, then ``verify`` and ``export``
on its records, and tamper detection on that real data (a log byte, a DB field)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.models import BaselineInfo

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def run_home(linked_home: Home, dev_baseline: BaselineInfo) -> Iterator[Home]:
    """A fresh home whose baseline store is the shared one (the session's Debian baseline)."""
    yield linked_home


def _task(root: Path, baseline: str) -> Path:
    t = root / "store-e2e"
    (t / "tests").mkdir(parents=True)
    (t / "instruction.md").write_text("Say hello.\n")
    (t / "task.toml").write_text(
        '[task]\nname = "store-e2e"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n'
        f'[rollbox]\nbaseline = "{baseline}"\n'
    )
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\necho verifier-ran\necho 1 > /logs/verifier/reward.txt\n"
    )
    return t


def rollbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_verify_and_export_on_a_real_run(
    run_home: Home, tmp_path: Path, dev_baseline: BaselineInfo
) -> None:
    task = _task(tmp_path, dev_baseline.digest)
    res = rollbox(
        "run", str(task), "--agent", "cmd:echo hello-from-agent", "--attempts", "2",
        "--backend", "namespace", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    runs = json.loads(rollbox("runs", "ls", "--json").stdout)
    assert len(runs) == 1
    run_id = runs[0]["id"]
    ok = rollbox("verify", run_id, "--json")
    doc = json.loads(ok.stdout)
    assert ok.returncode == 0 and doc["ok"] and doc["sealed"], ok.stdout
    assert doc["rollouts_checked"] == 2 and doc["blobs_checked"] >= 4

    out = tmp_path / "run.jsonl"
    assert rollbox("export", run_id, "-o", str(out), "--include-blobs").returncode == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert line["status"] == "done" and line["reward"] == 1.0 and line["passed"] is True
        assert line["instruction"] == "Say hello.\n"
        stdout = line["record"]["stdout"]
        assert "hello-from-agent" in line["blobs"][stdout["digest"]]["data"]

    # one byte of a stored log blob changes -> verify fails naming it
    victim = lines[0]
    digest = victim["record"]["stdout"]["digest"]
    blob = run_home.blobs / "sha256" / digest[7:9] / digest[7:]
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[0] ^= 0x01
    blob.write_bytes(bytes(data))
    bad = rollbox("verify", run_id, "--json")
    problems = json.loads(bad.stdout)["problems"]
    assert bad.returncode == 1
    # blobs are shared by content: every rollout whose stdout was this blob is named
    sharing = [x["rollout_id"] for x in lines if x["record"]["stdout"]["digest"] == digest]
    assert len(problems) == len(sharing) >= 1
    for rid, problem in zip(sorted(sharing), sorted(problems), strict=True):
        assert rid in problem and "'agent.stdout'" in problem and "modified" in problem
    data[0] ^= 0x01
    blob.write_bytes(bytes(data))
    assert rollbox("verify", run_id).returncode == 0

    # a record field edited in the database -> verify fails naming the record
    other = lines[1]
    rec = dict(other["record"])
    rec["exit_codes"] = {**rec["exit_codes"], "agent": 0}
    rec["seed"] = (rec["seed"] or 0) + 1
    with sqlite3.connect(run_home.db_path) as db:
        db.execute(
            "UPDATE rollouts SET doc = ? WHERE id = ?", (json.dumps(rec), other["rollout_id"])
        )
    bad = rollbox("verify", run_id, "--json")
    problems = json.loads(bad.stdout)["problems"]
    assert bad.returncode == 1
    assert any(other["rollout_id"] in p and "tampered" in p for p in problems), problems
