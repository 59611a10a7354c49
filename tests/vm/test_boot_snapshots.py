"""Boot snapshots: the first create of a shape boots cold and saves one; later creates
restore it with their own hostname, limits and fresh RNG; a corrupted one is not used (a
cold boot rebuilds it) and sandboxes already stacked on it keep working."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess

import pytest

from rollbox.backends.microvm import MicroVMBackend, MicroVMSandbox
from rollbox.backends.microvm.defaults import assets_home
from rollbox.config import Home
from rollbox.models import BaselineInfo, Limits, SandboxSpec

pytestmark = [pytest.mark.vm, pytest.mark.slow]

# an odd shape no other test uses, so this test owns its boot snapshot
LIMITS = Limits(memory_mb=48, disk_mb=48)
RNG = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"


def test_boot_snapshot_lifecycle(
    vm_backend: MicroVMBackend, vm_home: Home, vm_baseline: BaselineInfo
) -> None:
    be = vm_backend

    def spec(host: str) -> SandboxSpec:
        return SandboxSpec(
            baseline=vm_baseline.digest, backend="microvm", limits=LIMITS, hostname=host
        )

    async def make(host: str) -> MicroVMSandbox:
        h = await be.create(spec(host), vm_baseline)
        assert isinstance(h, MicroVMSandbox)
        return h

    async def go() -> None:
        boot = assets_home(vm_home).vm / "boot"
        # start from no boot snapshot of this shape
        probe_h = await make("probe")
        key = str(probe_h.info.extra["boot_snapshot"])
        await probe_h.destroy()
        tpl = boot / key
        shutil.rmtree(tpl, ignore_errors=True)

        a = await make("host-a")  # cold boot, saves the boot snapshot
        assert (tpl / "meta.json").is_file() and a.info.extra["boot_snapshot"] == key
        b = await make("host-b")  # restored from it
        try:
            assert b.info.extra["boot_snapshot"] == key and "qemu_pid" in b.info.extra
            assert (await b.exec("hostname")).stdout == "host-b\n"
            assert (await b.exec("cat /sys/fs/cgroup/rbx/memory.max")).stdout.strip() == str(
                48 << 20
            )
            assert (await a.exec(RNG)).stdout != (await b.exec(RNG)).stdout
            await b.write_file("/root/b", "b")

            # corrupt it (same size): the next create does not use it but boots cold.
            # A corrupted copy renamed over it, not a write in place: running restores
            # map the RAM image copy-on-write and would see in-place writes.
            mem = tpl / "ram.img"
            bad = tpl / "ram.img.bad"
            subprocess.run(["cp", "--sparse=always", mem, bad], check=True)
            with open(bad, "r+b") as f:
                f.seek(os.lseek(f.fileno(), 0, os.SEEK_DATA) + 100)
                f.write(os.urandom(4096))
            os.replace(bad, mem)
            c = await make("host-c")
            try:
                assert (await c.exec("hostname")).stdout == "host-c\n"
                assert (tpl / "meta.json").is_file()  # rebuilt by that cold boot
                # b's disk still stacks on the old frozen disk, which was kept
                assert (await b.read_file("/root/b")) == b"b"
            finally:
                await c.destroy()

            # garbage collection by `rollbox cleanup`: a boot snapshot whose baseline left
            # the store goes; a stale one (older agent/kernel) stays while running QEMUs
            # stack on its disks and goes after
            orphan = boot / ("0" * 32)
            shutil.copytree(tpl, orphan)
            meta = (orphan / "meta.json").read_text()
            (orphan / "meta.json").write_text(
                meta.replace(vm_baseline.digest, "sha256:" + "0" * 64)
            )
            meta = (tpl / "meta.json").read_text()
            initrd = str(json.loads(meta)["vm"]["initrd"])
            (tpl / "meta.json").write_text(meta.replace(initrd, "/nonexistent/old.cpio"))
            report = be.cleanup_orphans()
            assert f"boot snapshot {orphan.name} (its baseline is gone)" in report
            assert not orphan.exists() and tpl.is_dir()
            assert (await b.read_file("/root/b")) == b"b"
        finally:
            await a.destroy()
            await b.destroy()
        report = be.cleanup_orphans()
        assert f"boot snapshot {key} (saved with an older guest agent or kernel)" in report
        assert not tpl.exists()

    asyncio.run(go())
