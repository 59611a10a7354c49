"""``rollbox doctor``: every backend's needs checked, a missing one named with its fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox import hostcheck
from rollbox.cli.doctor import render
from rollbox.hostcheck import check_host


def test_report_covers_every_backend_and_the_cgroup_mode() -> None:
    report = check_host()
    assert set(report.backends) == {"namespace", "gvisor", "microvm"}
    assert report.cgroup_mode in {"v1", "v2", "hybrid", "none"}
    names = {c.name for c in report.checks}
    assert {"kernel", "root", "cgroups", "bwrap", "runsc", "qemu-system-x86_64"} <= names
    text = render(report)
    assert f"cgroups {report.cgroup_mode}" in text
    assert "backend namespace:" in text


def test_a_missing_tool_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which
    monkeypatch.setattr(
        hostcheck.shutil, "which", lambda name: None if name == "runsc" else real(name)
    )
    report = check_host()
    assert not report.backends["gvisor"].ready
    assert "runsc" in report.backends["gvisor"].missing
    assert "runsc" not in report.backends["namespace"].missing
    text = render(report)
    assert "MISS runsc" in text
    assert "fix: apt-get install runsc" in text
    assert "backend gvisor: NOT ready (missing: runsc" in text


def test_cli_json_and_exit_code(tmp_path: Path) -> None:
    env = {"ROLLBOX_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    exe = Path(sys.executable).with_name("rollbox")
    r = subprocess.run(
        [str(exe), "doctor", "--json"], capture_output=True, text=True, env=env, check=False
    )
    doc = json.loads(r.stdout)
    ready = all(b["ready"] for b in doc["backends"].values())
    assert r.returncode == (0 if ready else 1), r.stderr
    assert doc["kernel"] and doc["checks"]
