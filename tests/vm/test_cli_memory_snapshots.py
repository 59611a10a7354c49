"""``rollbox sandbox`` with microVM memory snapshots, each command in its own process:
create, exec, snapshot --memory, create --from-snapshot, snapshots, snapshot-rm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollbox.backends.microvm import MicroVMBackend
from rollbox.config import Home
from rollbox.models import BaselineInfo

pytestmark = [pytest.mark.vm, pytest.mark.slow]


def rb(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ROLLBOX_HOME=str(home.root))
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True, text=True, timeout=180, check=False, env=env,
    )  # fmt: skip


def test_memory_snapshot_round_trip_from_the_cli(
    vm_backend: MicroVMBackend, vm_home: Home, vm_baseline: BaselineInfo
) -> None:
    r = rb(vm_home, "sandbox", "create", "--backend", "microvm", "--baseline",
           vm_baseline.digest, "--memory-mb", "96", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    src = json.loads(r.stdout)
    assert src["accelerator"] in ("kvm", "tcg")
    sid = src["id"]
    r = rb(vm_home, "sandbox", "exec", sid, "--", "sh", "-c", "echo kept > /root/f; nproc")
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stderr

    r = rb(vm_home, "sandbox", "snapshot", sid, "--memory", "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)["snapshot"]
    assert snap.startswith("snap-")
    r = rb(vm_home, "sandbox", "snapshots", "--json")
    listed = {s["id"]: s for s in json.loads(r.stdout)}
    assert listed[snap]["source"] == sid and listed[snap]["layout"] == "split"

    # --from-snapshot picks the microvm backend and the snapshot's baseline by itself
    r = rb(vm_home, "sandbox", "create", "--from-snapshot", snap, "--json")
    assert r.returncode == 0, r.stderr
    branch = json.loads(r.stdout)
    assert branch["backend"] == "microvm" and branch["baseline"] == vm_baseline.digest
    r = rb(vm_home, "sandbox", "exec", branch["id"], "--", "cat", "/root/f")
    assert (r.returncode, r.stdout) == (0, "kept\n")

    # in use: refused with one line, exit 2
    r = rb(vm_home, "sandbox", "snapshot-rm", snap)
    assert r.returncode == 2 and "in use" in r.stderr and "Traceback" not in r.stderr
    for bad, words in (
        (["sandbox", "create", "--from-snapshot", "snap-nope"], "not a memory snapshot id"),
        (["sandbox", "create", "--from-snapshot", snap, "--backend", "namespace"], "microvm"),
        (["sandbox", "snapshot", sid, "--memory", "--name", "x"], "--name"),
    ):
        r = rb(vm_home, *bad)
        assert r.returncode == 2 and words in r.stderr, (bad, r.stderr)
        assert "Traceback" not in r.stderr

    assert rb(vm_home, "sandbox", "rm", branch["id"], sid).returncode == 0
    r = rb(vm_home, "sandbox", "snapshot-rm", snap, "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"removed": snap}
    assert json.loads(rb(vm_home, "sandbox", "snapshots", "--json").stdout) == []
