"""``rollbox baseline …`` end to end: exit codes, one-line errors, --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.config import Home

from .conftest import make_tiny_rootfs

pytestmark = [pytest.mark.root, pytest.mark.slow]


def rbx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", "baseline", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert proc.returncode == code, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_manage_flow(home: Home, tmp_path: Path) -> None:
    root = make_tiny_rootfs(tmp_path / "root")
    imported = rbx("import", str(root), "--name", "tiny:1", "--json")
    assert imported.returncode == 0, imported.stderr
    digest = json.loads(imported.stdout)["digest"]
    listing = json.loads(rbx("ls", "--json").stdout)
    assert [b["digest"] for b in listing] == [digest]
    assert rbx("tag", digest[7:19], "tiny:latest").returncode == 0
    shown = json.loads(rbx("show", "tiny:latest", "--json").stdout)
    assert shown["lineage"] == [digest] and shown["in_use_by"] == []
    assert set(shown["names"]) == {"tiny:1", "tiny:latest"}
    assert rbx("verify").returncode == 0
    layer = home.layers / json.loads(imported.stdout)["layers"][0]["diff_id"][7:]
    passwd = layer / "etc" / "passwd"
    passwd.write_text(passwd.read_text().replace("root", "r00t"))
    bad = rbx("verify")
    _one_line_error(bad, 1, str(passwd))
    bad_json = rbx("verify", "--json")
    assert bad_json.returncode == 1 and json.loads(bad_json.stdout)["corrupt"] == [str(passwd)]
    assert rbx("rm", "tiny:1").returncode == 0
    gc = json.loads(rbx("gc", "--json").stdout)
    assert len(gc["layers"]) == 1 and not layer.exists()


def test_bad_input_exit_2(home: Home, tmp_path: Path) -> None:
    _one_line_error(rbx("show", "sha256:zz"), 2, "malformed digest 'sha256:zz'")
    _one_line_error(rbx("show", "sha256:0123456789"), 2, "no baseline 'sha256:0123456789'")
    proc = rbx("show", "nope:1", "--json")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["type"] == "BaselineNotFoundError"
    (tmp_path / "r.json").write_text('{"suite": "bookworm", "pakages": ["git"]}')
    _one_line_error(rbx("bootstrap", str(tmp_path / "r.json")), 2, "unknown field 'pakages'")
    _one_line_error(rbx("bootstrap", "-p", "Bad Pkg"), 2, "not a Debian package name")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    _one_line_error(rbx("build", str(ctx)), 2, "FROM ubuntu:24.04")
    _one_line_error(rbx("import", str(tmp_path / "missing")), 2, "does not exist")
    _one_line_error(rbx("build", str(ctx), "--build-arg", "NOEQUALS"), 2, "not KEY=VALUE")
    _one_line_error(rbx("tag", "x", "has space"), 2, "invalid baseline name 'has space'")
    assert not list(home.tmp.iterdir())


def test_failed_step_exit_1_with_output(home: Home, tmp_path: Path) -> None:
    root = make_tiny_rootfs(tmp_path / "root")
    imported = rbx("import", str(root), "--name", "tiny:1", "--json")
    assert imported.returncode == 0
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM tiny:1\nRUN echo the-step-said-this && false\n")
    try:
        proc = rbx("build", str(ctx))
    finally:  # the base handed to containers-storage is unique to this test
        base = json.loads(imported.stdout)["digest"][7:]
        subprocess.run(["buildah", "rmi", f"localhost/rollbox-base:{base}"], capture_output=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: build of")
    assert "the-step-said-this" in proc.stderr
