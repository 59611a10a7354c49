"""Real cgroup v1 groups and overlay mounts (root)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from rollbox.backends.common.cgroups import CGROUP_ROOT, Cgroup, orphan_cgroups
from rollbox.backends.common.rootfs import Rootfs, orphan_mounts, remove_orphan_mounts
from rollbox.config import Home
from rollbox.errors import LimitsError
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, Limits

LeakCheck = Callable[[HostState, HostState], dict[str, list[str]]]

pytestmark = pytest.mark.root


def test_cgroup_limits_freeze_kill_destroy(home: Home, leaks: LeakCheck) -> None:
    before = HostState.capture()
    cg = Cgroup.create(home.tag, "sbx-cgtest", Limits(cpus=0.5, memory_mb=32, pids=10))
    try:
        assert (cg.paths["memory"] / "memory.limit_in_bytes").read_text().strip() == str(32 << 20)
        assert (cg.paths["pids"] / "pids.max").read_text().strip() == "10"
        assert (cg.paths["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
        # A daemon that escaped its parent is still found and killed.
        sub = cg.child("exec1")
        p = subprocess.Popen(["sh", "-c", "setsid sleep 300 & sleep 300"])
        sub.add(p.pid)
        assert p.pid in cg.pids()
        cg.freeze()
        assert cg.is_frozen()
        cg.thaw()
        # A memory hog is OOM-killed inside and counted.
        hog = subprocess.Popen(
            [
                "sh",
                "-c",
                f"echo $$ > {sub.paths['memory']}/cgroup.procs; "
                "exec python3 -c 'x = bytearray(200 << 20)'",
            ]
        )
        assert hog.wait(timeout=30) == -9
        # The pids limit holds.
        q = subprocess.run(
            [
                "sh",
                "-c",
                f"echo $$ > {sub.paths['pids']}/cgroup.procs; "
                "for i in $(seq 30); do sleep 30 >/dev/null 2>&1 & done",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "fork" in (q.stdout + q.stderr).lower()
        assert cg.pids_max_hits() >= 1
        assert cg.oom_kills() >= 1
    finally:
        cg.destroy()
    assert p.wait(timeout=5) == -9
    assert not (CGROUP_ROOT / "memory" / cg.name).exists()
    assert orphan_cgroups(home.tag, set()) == []
    assert leaks(before, HostState.capture()) == {}


def test_orphan_cgroups_finds_only_dead_ids(home: Home) -> None:
    a = Cgroup.create(home.tag, "sbx-a", Limits())
    b = Cgroup.create(home.tag, "sbx-b", Limits())
    try:
        assert [c.name for c in orphan_cgroups(home.tag, {"sbx-a"})] == [b.name]
        assert orphan_cgroups("ffffffff", set()) == [] or all(
            not c.name.startswith(f"rollbox-{home.tag}") for c in orphan_cgroups("ffffffff", set())
        )
    finally:
        a.destroy()
        b.destroy()


def test_rootfs_overlay_disk_limit_and_fork_copy(
    home: Home, leaks: LeakCheck, shared_home: Home, dev_baseline: BaselineInfo
) -> None:
    from rollbox.baselines.store import BaselineStore

    layers = BaselineStore(shared_home).layer_dirs(dev_baseline.digest)
    assert len(layers) == 1  # a whole Debian rootfs in one layer
    LOWER = layers[0]
    before = HostState.capture()
    d1 = home.sandboxes / "sbx-r1"
    fs = Rootfs.mount(d1, [LOWER], disk_mb=8)
    try:
        assert (fs.root / "usr/bin/python3").exists()
        (fs.root / "etc/hostname").write_text("changed\n")
        (fs.root / "etc/issue").unlink()  # a whiteout in the upper
        assert (fs.upper / "etc/hostname").read_text() == "changed\n"
        assert (LOWER / "etc/issue").exists()  # the baseline is untouched
        # The disk limit holds.
        proc = subprocess.run(
            ["dd", "if=/dev/zero", f"of={fs.root}/big", "bs=1M", "count=20"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode != 0 and "No space left" in proc.stderr
        (fs.root / "big").unlink()
        assert fs.disk_used() < 8 << 20
        # fork: a new rootfs seeded from this upper sees the changes, then diverges.
        d2 = home.sandboxes / "sbx-r2"
        fs2 = Rootfs.mount(d2, [LOWER], disk_mb=8, upper_from=fs.upper)
        try:
            assert (fs2.root / "etc/hostname").read_text() == "changed\n"
            assert not (fs2.root / "etc/issue").exists()
            (fs2.root / "etc/hostname").write_text("fork\n")
            assert (fs.root / "etc/hostname").read_text() == "changed\n"
            assert orphan_mounts(home, {"sbx-r1"}) != []
            assert remove_orphan_mounts(home, {"sbx-r1"}, dry_run=True)
        finally:
            fs2.unmount()
        with pytest.raises(LimitsError):
            Rootfs.mount(home.sandboxes / "sbx-r3", [LOWER], disk_mb=1, upper_from=LOWER / "usr")
    finally:
        fs.unmount()
    fs.unmount()  # idempotent
    assert orphan_mounts(home, set()) == []
    assert leaks(before, HostState.capture()) == {}
