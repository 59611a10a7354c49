"""The inspect/export/verify commands, run as the real CLI against a SQLite store."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.models import RolloutRecord
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

from .records import make_rollout, make_run


def rollbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _stored(meta: MetaStore, blobs: BlobStore, n: int = 3) -> tuple[str, list[RolloutRecord]]:
    run = make_run(status="done")
    meta.create_run(run)
    ros = [make_rollout(blobs, run.id, "t", a, reward=float(a % 2)) for a in range(n)]
    for r in ros:
        meta.save_rollout(r)
    provenance.finalize_run(meta, run)
    return run.id, ros


def _verify(run_id: str) -> tuple[int, dict[str, object]]:
    res = rollbox("verify", run_id, "--json")
    return res.returncode, json.loads(res.stdout)


def test_verify_passes_then_fails_after_one_log_byte_changes(
    home: Home, meta: MetaStore, blobs: BlobStore
) -> None:
    run_id, ros = _stored(meta, blobs)
    rc, doc = _verify(run_id)
    assert rc == 0 and doc["ok"] is True and doc["sealed"] is True and doc["problems"] == []
    assert doc["rollouts_checked"] == 3
    ref = ros[1].stdout
    assert ref is not None
    p = blobs.path(ref.digest)
    p.chmod(0o644)
    raw = bytearray(p.read_bytes())
    raw[3] ^= 0x01
    p.write_bytes(bytes(raw))
    rc, doc = _verify(run_id)
    assert rc == 1 and doc["ok"] is False
    problems = doc["problems"]
    assert isinstance(problems, list) and len(problems) == 1
    assert ros[1].id in problems[0] and "'stdout'" in problems[0] and "modified" in problems[0]
    # the human form names it too, and exits 1
    res = rollbox("verify", run_id)
    assert res.returncode == 1 and ros[1].id in res.stdout and "FAILED" in res.stdout


def test_verify_names_a_record_edited_in_the_database(
    home: Home, meta: MetaStore, blobs: BlobStore
) -> None:
    run_id, ros = _stored(meta, blobs)
    target = ros[0]
    doc = json.loads(target.model_dump_json())
    doc["verifier"]["reward"] = 1.0
    doc["verifier"]["passed"] = True
    with sqlite3.connect(home.db_path) as db:
        db.execute("UPDATE rollouts SET doc = ? WHERE id = ?", (json.dumps(doc), target.id))
        db.execute("UPDATE rollouts SET status = 'failed' WHERE id = ?", (ros[2].id,))
    rc, out = _verify(run_id)
    assert rc == 1
    problems = out["problems"]
    assert isinstance(problems, list)
    assert any(target.id in p and "tampered" in p for p in problems)
    assert any(ros[2].id in p and "column status" in p for p in problems)


def test_verify_names_deleted_and_unreadable_records(
    home: Home, meta: MetaStore, blobs: BlobStore
) -> None:
    run_id, ros = _stored(meta, blobs)
    with sqlite3.connect(home.db_path) as db:
        db.execute("DELETE FROM rollouts WHERE id = ?", (ros[0].id,))
        db.execute("UPDATE rollouts SET doc = '{not json' WHERE id = ?", (ros[1].id,))
    rc, out = _verify(run_id)
    problems = out["problems"]
    assert rc == 1 and isinstance(problems, list)
    assert any(ros[0].id in p and "missing" in p for p in problems)
    assert any(ros[1].id in p and "cannot be read" in p for p in problems)


def test_inspect_commands_json(
    home: Home, meta: MetaStore, blobs: BlobStore, tmp_path: Path
) -> None:
    run_id, ros = _stored(meta, blobs)
    res = rollbox("runs", "ls", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["id"] for r in rows] == [run_id] and rows[0]["rollouts"] == 3 and rows[0]["sealed"]
    res = rollbox("report", run_id[:12], "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["tasks"][0]["attempts"] == 3 and summary["tasks"][0]["passed"] == 1
    res = rollbox("rollout", "show", ros[0].id, "--json")
    assert res.returncode == 0 and RolloutRecord.model_validate_json(res.stdout) == ros[0]
    res = rollbox("rollout", "show", ros[0].id, "--logs")
    assert res.returncode == 0 and "agent output t 0" in res.stdout
    out = tmp_path / "run.jsonl"
    res = rollbox("export", "latest", "-o", str(out), "--include-blobs", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["rollouts"] == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(d["rollout_id"] for d in lines) == sorted(r.id for r in ros)
    assert all("blobs" in d for d in lines)


def test_bad_input_is_one_line_exit_2(
    home: Home, meta: MetaStore, blobs: BlobStore, tmp_path: Path
) -> None:
    _stored(meta, blobs)
    for args in (
        ("verify", "run-doesnotexist"),
        ("report", "zzz"),
        ("rollout", "show", "ro-nope"),
        ("export", "latest", "-o", str(tmp_path / "no" / "dir.jsonl")),
        ("export", "latest", "-o", str(tmp_path)),
        ("runs", "ls", "--db", "mysql://u@h/db"),
    ):
        res = rollbox(*args)
        assert res.returncode == 2, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, res.stderr)
        assert "Traceback" not in res.stderr
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    res = rollbox("verify", "nope", "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["type"] == "RunNotFoundError"


def test_run_whose_process_died_shows_as_interrupted(
    home: Home, meta: MetaStore, blobs: BlobStore
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    run = make_run(owner_pid=dead.pid, host="")
    meta.create_run(run)
    meta.save_rollout(make_rollout(blobs, run.id, status="running", seal=False))
    res = rollbox("runs", "ls", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)[0]["status"] == "interrupted"
    res = rollbox("report", run.id, "--json")
    assert json.loads(res.stdout)["status"] == "interrupted"
    # unsealed, unfinished work of a killed run is a warning, not tampering
    rc, doc = _verify(run.id)
    assert rc == 0 and doc["sealed"] is False and len(doc["warnings"]) == 2
    live = make_run(owner_pid=os.getpid(), host="")
    meta.create_run(live)
    rows = {r["id"]: r for r in json.loads(rollbox("runs", "ls", "--json").stdout)}
    assert rows[live.id]["status"] == "running"


def test_a_corrupt_database_file_is_one_line(home: Home, tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a sqlite database" * 100)
    res = rollbox("runs", "ls", "--db", f"sqlite:///{bad}")
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "not a database" in res.stderr


def test_human_output_is_complete_and_markup_safe(
    home: Home, meta: MetaStore, blobs: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the task name must not be folded over lines
    run = make_run(status="done")
    meta.create_run(run)
    rec = make_rollout(blobs, run.id, "[bold]task[/]")
    meta.save_rollout(rec)
    provenance.finalize_run(meta, run)
    res = rollbox("runs", "ls")
    assert res.returncode == 0 and run.id in res.stdout and "done:1" in res.stdout
    assert rollbox("report", run.id).stdout.count("[bold]task[/]") == 1
    # a problem line quoting odd names is printed verbatim
    assert rec.stdout is not None
    blobs.path(rec.stdout.digest).unlink()
    res = rollbox("verify", run.id)
    assert res.returncode == 1 and f"problem: rollout {rec.id}: blob 'stdout'" in res.stdout
