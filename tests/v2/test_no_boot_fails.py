"""A cgroup-v2 guest that cannot boot fails the tests, never skips them (checked in a
child pytest whose PATH hides QEMU, so the microvm backend cannot start a guest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.root, pytest.mark.vm]


def test_a_guest_that_cannot_boot_is_an_error_not_a_skip(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROLLBOX_REQUIRE_BACKENDS"}
    env["PATH"] = str(tmp_path)  # no qemu-system-x86_64 (nor anything else) on it
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
         "tests/v2/test_cgroup_v2.py::test_guest_is_cgroup_v2_and_rollbox_works_below_its_own_cgroup"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "in boot" in out, out  # raised while booting the guest
