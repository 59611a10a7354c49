"""`rollbox run` / `rollbox repro` refuse bad input with one line and exit 2, nothing started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.config import Home

ROLLBOX = str(Path(sys.executable).with_name("rollbox"))


def _task(root: Path) -> Path:
    d = root / "t"
    (d / "tests").mkdir(parents=True)
    (d / "instruction.md").write_text("x\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return d


def _run(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"ROLLBOX_HOME": str(home.root), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run([ROLLBOX, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run"], "no task directories given"),
        (["run", "/no/such/task"], "does not exist"),
        (["run", "{task}", "--agent", "gpt-9"], "unknown agent 'gpt-9'"),
        (["run", "{task}", "--agent", "python:nope_mod_zz:f"], "cannot import module"),
        (["run", "{task}", "--backend", "docker"], "unknown backend 'docker'"),
        (["run", "{task}", "--concurrency", "0"], "--concurrency must be at least 1"),
        (["run", "{task}", "--attempts", "0"], "--attempts must be at least 1"),
        (["run", "{task}", "--retries", "-1"], "--retries must be 0 or more"),
        (["run", "{task}", "--resume", "run-x"], "either TASK_DIR... or --resume"),
        (["run", "--resume", "run-nope"], "run"),
        (["repro", "run-nope"], "run"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    home: Home, tmp_path: Path, args: list[str], needle: str
) -> None:
    task = str(_task(tmp_path))
    r = _run(home, *[a.replace("{task}", task) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


def test_bad_input_json(home: Home, tmp_path: Path) -> None:
    r = _run(home, "run", str(_task(tmp_path)), "--agent", "gpt-9", "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert doc["type"] == "UnknownAgentError" and "gpt-9" in doc["error"]


def test_nothing_half_written(home: Home, tmp_path: Path) -> None:
    _run(home, "run", str(_task(tmp_path)), "--agent", "gpt-9")
    r = _run(home, "runs", "ls", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    runs = doc if isinstance(doc, list) else doc.get("runs", [])
    assert runs == []
