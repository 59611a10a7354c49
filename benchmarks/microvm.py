"""microVM backend: rollbox side by side with raw QEMU, in the same run.

* create → first exec result (``python3 -c 'print(42)'``) vs raw QEMU booting the same
  kernel and the same baseline disk to that command and powering off (an initramfs whose
  init mounts the disk, chroots, runs the command and reboots; ``-no-reboot`` ends QEMU);
  reported twice: a true cold boot (boot snapshots off) and the default path, which
  restores the boot snapshot the first create of that baseline and VM shape saved;
* restore from a memory snapshot → first exec result, vs a naive raw restore
  (``qemu … -incoming "exec:cat FILE"`` of the same snapshot, polled with QMP until the
  migration is in, then ``cont``: the floor without rollbox's agent round trip);
* fork 4 from a memory snapshot, in total;
* host memory per VM beyond guest RAM: QEMU's RSS minus the resident part of its guest-RAM
  mapping, for idle running sandboxes.

Runs alternate rollbox/raw so both see the same machine load; the accelerator is recorded.
Usage: ``python benchmarks/microvm.py [-n N]`` (root); writes benchmarks/results/microvm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _rootfs import debian_rootfs_tar  # benchmarks/_rootfs.py
from rollbox.backends.microvm import MicroVMBackend, MicroVMSandbox
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.defaults import assets_home
from rollbox.backends.microvm.disk import ensure_base_image
from rollbox.backends.microvm.initramfs import _build, ensure_initramfs
from rollbox.backends.microvm.kernel import ensure_kernel
from rollbox.backends.microvm.qemu import (
    BASE_APPEND,
    QEMU,
    QMP,
    TB_MB,
    TCG_APPEND,
    host_tsc_khz,
)
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import Limits, SandboxSpec

RESULTS = Path(__file__).with_name("results") / "microvm.json"
CMD = "python3 -c 'print(42)'"

RAW_INIT = r"""#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in MODULES; do $B insmod /lib/modules/$m.ko; done
while [ ! -e /dev/vda ]; do $B usleep 1000; done
$B mkdir -p /root
$B mount -o ro,noload /dev/vda /root
$B chroot /root /bin/sh -c "CMD"
$B reboot -f
""".replace("CMD", CMD)


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return {"n": len(xs), "p50": statistics.median(xs), "p99": p99, "min": xs[0], "max": xs[-1]}


def raw_boot(kernel: Path, initrd: Path, image: Path, accel: str) -> float:
    append = BASE_APPEND.replace("quiet loglevel=1", "quiet")
    if accel == "tcg":
        append += f" {TCG_APPEND} tsc_early_khz={host_tsc_khz()}"
    argv = [
        QEMU, "-M", "microvm,x-option-roms=off,rtc=on,isa-serial=on",
        "-accel", "tcg,thread=multi" if accel == "tcg" else "kvm", "-cpu", "max",
        "-m", "256", "-smp", "1", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-serial", "stdio", "-kernel", str(kernel), "-initrd", str(initrd), "-append", append,
        "-drive", f"id=root,file={image},format=raw,if=none,readonly=on",
        "-device", "virtio-blk-device,drive=root",
    ]  # fmt: skip
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    dt = time.monotonic() - t0
    if "42" not in out.stdout:
        raise RuntimeError(f"raw boot did not print 42: {out.stdout[-500:]} {out.stderr[-300:]}")
    return dt


def raw_restore(snap: snaps.MemorySnapshot, home: Home, scratch: Path) -> float:
    """Raw QEMU restoring the same snapshot to *running* (no exec): for a ``stream`` snapshot
    the naive way (``-incoming exec:cat memory.bin``), for a ``split`` one the way rollbox
    does it (RAM image mapped copy-on-write, ``-incoming exec:cat state.bin``); poll QMP
    until loaded, then ``cont``."""
    vm = dict(snap.vm)
    disk = scratch / "raw-restore.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b",
         str(snaps.snap_dir(home, snap.id) / "disk.qcow2"), "-F", "qcow2", str(disk)],
        check=True,
    )  # fmt: skip
    qmp = scratch / "qmp.sock"
    from rollbox.backends.microvm.qemu import VMConfig

    cfg = VMConfig.from_json(vm)
    cfg.disk, cfg.run_dir, cfg.console_log = str(disk), str(scratch), str(scratch / "c.log")
    cfg.name = "rbx-bench-raw"
    sdir = snaps.snap_dir(home, snap.id)
    cfg.mem_file = str(sdir / "ram.img") if snap.layout == "split" else ""
    mem = snaps.stream_file(snap, sdir)
    argv = [a for a in cfg.argv(incoming=f"exec:cat {mem}") if a != "-daemonize"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not qmp.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("raw restore: QEMU did not start")
            time.sleep(0.002)
        with QMP(qmp) as mon:
            while mon.execute("query-status").get("status") == "inmigrate":
                time.sleep(0.002)
            mon.execute("cont")
        return time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
        for p in (disk, qmp, scratch / "agent.sock", scratch / "qemu.pid"):
            p.unlink(missing_ok=True)


def overhead_mib(pid: int, guest_mb: int, field: str = "Rss") -> float:
    """QEMU's RSS (or PSS: shared libraries split among the VMs) minus the resident part of
    its guest-RAM mapping, in MiB."""
    total = guest = 0
    size = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0].isdigit() or line[0] in "abcdef":
                size = 0
                continue
            key, _, val = line.partition(":")
            if key == "Size":
                size = int(val.split()[0])
            elif key == field:
                kb = int(val.split()[0])
                total += kb
                if size >= guest_mb * 1024:
                    guest += kb
    return (total - guest) / 1024


async def main_async(n: int) -> dict[str, Any]:
    home = Home(Path(tempfile.mkdtemp(prefix="rbx-bench-microvm-", dir="/var/tmp"))).ensure()
    os.environ["ROLLBOX_HOME"] = str(home.root)
    store = BaselineStore(home)
    base = store.import_rootfs(debian_rootfs_tar(), names=["bench/dev"])
    be = MicroVMBackend(home)
    be.prepare()
    accel = be.accelerator
    assets = assets_home(home)
    kernel = ensure_kernel(assets)
    image = ensure_base_image(assets, base.digest, store.layer_dirs(base.digest))
    raw_initrd = home.tmp / "raw-initrd.cpio"
    raw_initrd.write_bytes(_build(kernel, RAW_INIT, b""))  # raw: no agent
    ensure_initramfs(assets, kernel)
    spec = SandboxSpec(baseline=base.digest, backend="microvm", limits=Limits(memory_mb=96))
    cold: list[float] = []
    warm: list[float] = []
    raw: list[float] = []
    restore: list[float] = []
    restore_stream: list[float] = []
    naive: list[float] = []
    raw_lazy: list[float] = []
    workload: dict[str, float] = {}
    forks: list[float] = []
    mem: list[float] = []
    pss: list[float] = []

    # create -> first exec, alternating with raw boots: cold boots, then boot-snapshot
    # creates (the first of which saves the boot snapshot and is not counted)
    for templates, out in ((False, cold), (True, None), *((True, warm),) * n):
        be.reconfigure(be.vm_config.model_copy(update={"boot_snapshots": templates}))
        for _ in range(n if out is cold else 1):
            if out is not None:
                raw.append(raw_boot(kernel.vmlinuz, raw_initrd, image, accel.accelerator))
            t0 = time.monotonic()
            h = await be.create(spec, base)
            r = await h.exec(["python3", "-c", "print(42)"])
            if out is not None:
                out.append(time.monotonic() - t0)
            assert r.stdout == "42\n"
            await h.destroy()

    src = await be.create(spec, base)
    assert isinstance(src, MicroVMSandbox)
    await src.exec("echo ready > /tmp/r")
    snap = await src.memory_snapshot()  # split layout (the default)
    assert snap.layout == "split"
    split = be.vm_config
    be.reconfigure(split.model_copy(update={"split_memory": False}))  # one plain stream
    await src.exec("true")
    snap_stream = await src.memory_snapshot()
    be.reconfigure(split)
    assert snap_stream.layout == "stream"
    scratch = Path(tempfile.mkdtemp(prefix="raw-", dir="/run"))

    async def restore_first_exec(which: snaps.MemorySnapshot) -> float:
        t0 = time.monotonic()
        h = await be.create(spec.model_copy(update={"from_snapshot": which.id}), base)
        r = await h.exec(["cat", "/tmp/r"])
        dt = time.monotonic() - t0
        assert r.stdout == "ready\n"
        await h.destroy()
        return dt

    for _ in range(n):
        naive.append(raw_restore(snap_stream, home, scratch))
        raw_lazy.append(raw_restore(snap, home, scratch))
        restore.append(await restore_first_exec(snap))
        restore_stream.append(await restore_first_exec(snap_stream))

    # guest code speed vs the TCG cache size: the same Python imports twice in a branch
    for tb in (16, 32):
        be.reconfigure(be.vm_config.model_copy(update={"tb_mb": tb}))  # restores use it
        h = await be.create(spec.model_copy(update={"from_snapshot": snap.id}), base)
        for i in range(2):
            t0 = time.monotonic()
            await h.exec(["python3", "-c", "import json, re, subprocess, tarfile"])
            workload[f"tb{tb}_run{i + 1}_s"] = time.monotonic() - t0
        workload[f"tb{tb}_pss_mib"] = overhead_mib(h.pid or 0, h.vm.memory_mb, "Pss")
        await h.destroy()
    be.reconfigure(be.vm_config.model_copy(update={"tb_mb": TB_MB}))
    for _ in range(max(1, n // 2)):
        t0 = time.monotonic()
        made = await be.restore_many(snap, 4, spec)
        await asyncio.gather(*(m.exec(["true"]) for m in made))
        forks.append(time.monotonic() - t0)
        await asyncio.sleep(1.0)  # let the guests settle to idle
        guest_mb = made[0].vm.memory_mb
        mem += [overhead_mib(m.pid or 0, guest_mb) for m in made]
        pss += [overhead_mib(m.pid or 0, guest_mb, "Pss") for m in made]
        for m in made:
            await m.destroy()
    mem.append(overhead_mib(src.pid or 0, src.vm.memory_mb))
    await src.destroy()
    for sn in (snap_stream, snap):  # the later one stacks on the earlier
        be.remove_snapshot(sn.id)
    shutil.rmtree(scratch, ignore_errors=True)
    be.cleanup_orphans()
    shutil.rmtree(home.root, ignore_errors=True)
    return {
        "benchmark": "microvm",
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "accelerator": accel.accelerator,
        "accelerator_reason": accel.reason,
        "kernel": kernel.version,
        "qemu": be.version(),
        "guest_ram_mb": spec.limits.memory_mb,
        "cold_boot_create_to_first_exec_s": stats(cold),
        "create_from_boot_snapshot_to_first_exec_s": stats(warm),
        "raw_qemu_boot_to_command_s": stats(raw),
        "cold_boot_ratio_p50": statistics.median(cold) / statistics.median(raw),
        "boot_snapshot_ratio_p50": statistics.median(warm) / statistics.median(raw),
        "restore_to_first_exec_s": stats(restore),
        "restore_stream_layout_to_first_exec_s": stats(restore_stream),
        "naive_raw_restore_to_running_s": stats(naive),
        "raw_lazy_restore_to_running_s": stats(raw_lazy),
        "restore_ratio_to_naive_raw_p50": statistics.median(restore) / statistics.median(naive),
        "snapshot_split_state_bytes": snap.memory_size,
        "snapshot_stream_bytes": snap_stream.memory_size,
        "guest_python_imports_s": workload,
        "fork4_total_s": stats(forks),
        "host_memory_beyond_guest_ram_mib": stats(mem),
        "host_memory_beyond_guest_ram_pss_mib": stats(pss),
        "tcg_tb_size_mib": TB_MB,
        "targets": {
            "cold_p50_s": 1.5,
            "restore_p50_s": 0.4,
            "fork4_total_s": 2.0,
            "host_memory_mib": 40,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    result = asyncio.run(main_async(args.n))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
