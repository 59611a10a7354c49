"""ROLLBOX_REQUIRE_BACKENDS: a backend that cannot run fails the run instead of skipping.

A corrupted copy of the namespace backend's C agent source is compiled in a child pytest
(``corrupt_agent_case.py``): with the variable set the test fails and names the compiler's
complaint; without it the test is skipped and the run ends with a line naming the backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASE = Path(__file__).with_name("corrupt_agent_case.py")
REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.root


def _child(require: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLBOX_REQUIRE_BACKENDS"}
    if require is not None:
        env["ROLLBOX_REQUIRE_BACKENDS"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(CASE), "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_corrupted_agent_fails_when_the_backend_is_required() -> None:
    r = _child("namespace,gvisor,microvm")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed" in out, out
    assert "backend namespace is required (ROLLBOX_REQUIRE_BACKENDS) but unavailable" in out
    assert "building rollbox-agent failed" in out, out
    assert "skipped" not in out.split("short test summary")[-1], out


def test_corrupted_agent_skips_with_a_summary_line_otherwise() -> None:
    r = _child(None)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 skipped" in out, out
    assert "rollbox: backend namespace was SKIPPED (building rollbox-agent failed" in out, out


def test_misspelt_backend_stops_the_run() -> None:
    r = _child("namespce")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "ROLLBOX_REQUIRE_BACKENDS: unknown backend namespce" in r.stdout + r.stderr
