"""Limit reasons on real microVMs (the guest agent reads the exec's cgroup v2 memory.events
and pids.events and the root's free space): a memory hog (memory_mb=64), a fork bomb
(pids=32), a ``dd`` filling a disk_mb=16 upper, a TTL expiring under a long exec -- at the
Sandbox API level and through the runner (never retried, never the task's or infra's)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from rollbox.backends.common.reasons import seen
from rollbox.backends.microvm import MicroVMBackend
from rollbox.errors import SandboxExpiredError
from rollbox.models import BaselineInfo, Limits, SandboxSpec
from rollbox.rollouts import runner as runner_mod
from rollbox.rollouts.tasks import Task

pytestmark = [pytest.mark.vm, pytest.mark.slow]

HOG = "python3 -c 'b=[]\nwhile True: b.append(bytearray(1 << 20))'"
FORKS = "for i in $(seq 64); do sleep 3 & done; wait; echo done"
FILL = "dd if=/dev/zero of=/tmp/fill bs=1M count=64; echo dd-exit=$?"


def write_task(root: Path, name: str, *, toml: str, solve: str, test: str) -> Path:
    """A Harbor task on the default baseline."""
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(f"Task {name}.\n")
    (d / "task.toml").write_text(textwrap.dedent(toml))
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + test + "\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")
    return d


def test_exec_reasons_in_a_vm(vm_backend: MicroVMBackend, vm_baseline: BaselineInfo) -> None:
    async def go() -> None:
        spec = SandboxSpec(
            baseline=vm_baseline.digest, limits=Limits(memory_mb=64, pids=32, disk_mb=16)
        )
        h = await vm_backend.create(spec, vm_baseline)
        try:
            plain = await h.exec("echo hi; head -c 1000000 /dev/zero > /tmp/small")
            assert plain.ok and plain.reasons == [], plain

            r = await h.exec(["bash", "-c", FORKS], timeout=120)
            assert r.pids_exhausted and r.reasons == ["pids_exhausted"], r

            r = await h.exec(["bash", "-c", FILL], timeout=120)
            assert r.disk_full and r.reasons == ["disk_full"], r
            assert "No space left on device" in r.stderr
            r = await h.exec("rm -f /tmp/fill")
            assert r.ok and not r.disk_full

            r = await h.exec(["bash", "-c", HOG], timeout=120)
            assert r.oom_killed and r.exit_code == 137 and r.reasons == ["oom_killed"], r
            assert seen(h) == ["pids_exhausted", "disk_full", "oom_killed"]
        finally:
            await h.destroy()

    asyncio.run(go())


def test_ttl_expiry_in_a_vm_names_the_ttl(
    vm_backend: MicroVMBackend, vm_baseline: BaselineInfo
) -> None:
    async def go() -> None:
        spec = SandboxSpec(baseline=vm_baseline.digest, ttl_s=15.0)
        h = await vm_backend.create(spec, vm_baseline)
        try:
            with pytest.raises(SandboxExpiredError, match=r"reached its TTL of 15 s"):
                await asyncio.wait_for(h.exec("sleep 120", timeout=100), 110)
            assert seen(h) == ["ttl_expired"]
        finally:
            await h.destroy()
        assert not h.alive()

    asyncio.run(go())


@pytest.mark.root
def test_runner_blames_the_agent_in_a_vm(
    vm_backend: MicroVMBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rollbox.rollouts.runs import Run, RunOptions
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

    home = vm_backend.home
    tmp = tmp_path
    test = "if [ -f /tmp/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt"
    hog = write_task(
        tmp, "vm-hog", toml="[environment]\nmemory_mb = 64\n",
        solve=f"{HOG} && touch /tmp/done", test=test,
    )  # fmt: skip
    fill = write_task(
        tmp, "vm-fill", toml="[environment]\nstorage_mb = 16\n",
        solve=f"{FILL}\ntouch /tmp/done", test=test,
    )  # fmt: skip
    monkeypatch.setattr(runner_mod, "TTL_MARGIN_S", 25.0 - 120.0 - 60.0)
    ttl = write_task(
        tmp, "vm-ttl", toml="[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n",
        solve="sleep 100\ntouch /tmp/done", test=test,
    )  # fmt: skip
    forks = write_task(tmp, "vm-forks", toml="", solve=f"{FORKS}\ntouch /tmp/done", test=test)
    # task.toml has no pids setting (Harbor has none): every sandbox of this run gets 32
    limits = Task.limits
    monkeypatch.setattr(Task, "limits", lambda self: limits(self).model_copy(update={"pids": 32}))
    meta = MetaStore(f"sqlite:///{tmp / 'db'}", home=home)
    blobs = BlobStore(home)
    expect = {
        "vm-hog": "oom_killed",
        "vm-fill": "disk_full",
        "vm-ttl": "ttl_expired",
        "vm-forks": "pids_exhausted",
    }
    dirs = [str(d) for d in (hog, fill, ttl, forks)]
    opts = RunOptions(task_dirs=dirs, backend="microvm", retries=2, concurrency=2)
    run = Run(home, meta, blobs, opts)
    run.start_new()
    result = asyncio.run(run.execute())
    recs = meta.rollouts_of(result.run.id)
    assert sorted(r.task_name for r in recs) == sorted(expect)  # one each: never retried
    for rec in recs:
        reason = expect[rec.task_name]
        assert rec.reasons == [reason], (rec.task_name, rec.reasons, rec.error)
        assert rec.reason_phases[reason] == "agent"
        assert rec.status in ("done", "failed") and rec.error_kind in (None, "agent"), rec.error
        if reason == "ttl_expired":
            assert rec.status == "failed" and rec.error is not None
            assert "reached its TTL of 25 s" in rec.error
