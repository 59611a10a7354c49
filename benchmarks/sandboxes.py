"""Sandboxes (``namespace`` backend), side by side with raw bubblewrap in the same run.

* create -> first exec result of ``true`` (cold: no pool) vs raw
  ``bwrap --bind ROOT / --dev /dev --proc /proc --unshare-all --die-with-parent true``
  spawned from Python the same way (runs alternate so both see the same load);
* exec round trip of ``true`` in a running sandbox;
* destroy;
* fork into 8 from a ~1 GB baseline vs from a ~10 MB baseline (ratio);
* N idle sandboxes alive at once: host memory per sandbox, measured three ways --
  PSS of every process in the sandboxes' cgroups (bwrap + agent, from smaps_rollup),
  the sandboxes' memory cgroups' usage (charged kernel + tmpfs + page cache), and the
  drop of the host's MemAvailable.

Usage: ``python benchmarks/sandboxes.py [-n N] [--idle N]`` (root; ROLLBOX_HOME may be
set, default /var/tmp/rbx-bench-sandboxes); writes benchmarks/results/sandboxes.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _rootfs import debian_rootfs_dir, debian_rootfs_tar  # benchmarks/_rootfs.py
from _stats import stats_ms  # benchmarks/_stats.py (scripts run from benchmarks/)
from rollbox.backends.base import SandboxHandle
from rollbox.backends.namespace import NamespaceBackend
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import BaselineInfo, Limits, SandboxSpec

RESULTS = Path(__file__).with_name("results") / "sandboxes.json"


def stats(xs: list[float]) -> dict[str, float]:
    """Median, p99 (nearest rank) and mean in milliseconds."""
    return stats_ms(xs)


def baseline(store: BaselineStore, name: str, build: callable) -> BaselineInfo:  # type: ignore[valid-type]
    found = store.find_name(name)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        root = Path(d) / "rootfs"
        build(root)
        return store.import_rootfs(root, names=[name])


def small_rootfs(root: Path) -> None:
    """~10 MB: busybox-static plus padding."""
    (root / "bin").mkdir(parents=True)
    for d in ("tmp", "root", "etc", "proc", "dev", "run"):
        (root / d).mkdir()
    subprocess.run(["cp", "/bin/busybox", str(root / "bin/busybox")], check=True)
    for app in ("sh", "cat", "echo", "true", "ls"):
        (root / "bin" / app).symlink_to("busybox")
    (root / "pad").write_bytes(os.urandom(9 << 20))


def big_rootfs(root: Path) -> None:
    """~1 GB: the default Debian rootfs plus 800 MB of incompressible data."""
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(debian_rootfs_tar())], check=True)
    pad = root / "opt" / "pad"
    pad.mkdir(parents=True, exist_ok=True)
    for i in range(8):
        (pad / f"blob{i}").write_bytes(os.urandom(100 << 20))


def raw_bwrap(root: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        [
            *("bwrap", "--ro-bind", str(root), "/", "--dev", "/dev", "--proc", "/proc"),
            *("--unshare-all", "--die-with-parent", "true"),
        ],
        check=True,
    )
    return time.perf_counter() - t


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=40, help="samples per timing")
    ap.add_argument("--idle", type=int, default=200, help="idle sandboxes at once")
    ap.add_argument("--fork-n", type=int, default=10, help="fork(8) samples per baseline")
    args = ap.parse_args()
    home = Home(Path(os.environ.get("ROLLBOX_HOME", "/var/tmp/rbx-bench-sandboxes"))).ensure()
    store = BaselineStore(home)
    dev = store.find_name("bench/dev") or store.import_rootfs(
        debian_rootfs_tar(), names=["bench/dev"]
    )
    be = NamespaceBackend(home)
    be.prepare()
    spec = SandboxSpec(baseline=dev.digest, limits=Limits(disk_mb=64))
    raw_root = debian_rootfs_dir()
    out: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "backend": be.version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }

    # warm caches (agent build, seccomp, page cache)
    for _ in range(3):
        h = await be.create(spec, dev)
        await h.exec(["true"])
        await h.destroy()
        raw_bwrap(raw_root)

    create_first: list[float] = []
    raw: list[float] = []
    destroy: list[float] = []
    for _ in range(args.n):
        t = time.perf_counter()
        h = await be.create(spec, dev)
        r = await h.exec(["true"])
        create_first.append(time.perf_counter() - t)
        assert r.exit_code == 0
        t = time.perf_counter()
        await h.destroy()
        destroy.append(time.perf_counter() - t)
        raw.append(raw_bwrap(raw_root))
    c, rw = stats(create_first), stats(raw)
    out["create_to_first_exec"] = {
        "rollbox": c,
        "raw_bwrap": rw,
        "ratio_p50": round(c["p50_ms"] / rw["p50_ms"], 2),
        "ratio_p99": round(c["p99_ms"] / rw["p99_ms"], 2),
    }
    out["destroy"] = stats(destroy)

    h = await be.create(spec, dev)
    rtt: list[float] = []
    for _ in range(args.n * 5):
        t = time.perf_counter()
        await h.exec(["true"])
        rtt.append(time.perf_counter() - t)
    out["exec_round_trip"] = stats(rtt)
    await h.destroy()

    small = baseline(store, "bench/small-10mb", small_rootfs)
    big = baseline(store, "bench/big-1gb", big_rootfs)
    fork_res: dict[str, object] = {}
    fork_times: dict[str, list[float]] = {"small_10mb": [], "big_1gb": []}
    # Alternate the two baselines so both see the same machine load.
    for _ in range(args.fork_n):
        for label, base in (("small_10mb", small), ("big_1gb", big)):
            parent = await be.create(SandboxSpec(baseline=base.digest), base)
            await parent.exec(["sh", "-c", "echo state > /root/f"])
            t = time.perf_counter()
            kids = await parent.fork(8)
            fork_times[label].append(time.perf_counter() - t)
            for k in (*kids, parent):
                await k.destroy()
    for label, base in (("small_10mb", small), ("big_1gb", big)):
        fork_res[label] = {"baseline_bytes": base.size, **stats(fork_times[label])}
    fs, fb = fork_res["small_10mb"], fork_res["big_1gb"]
    assert isinstance(fs, dict) and isinstance(fb, dict)
    fork_res["ratio_p50_big_over_small"] = round(fb["p50_ms"] / fs["p50_ms"], 2)
    out["fork8"] = fork_res

    out["idle"] = await idle(be, spec, dev, args.idle)
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def _meminfo(*keys: str) -> int:
    """Sum of the given /proc/meminfo fields, in bytes."""
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            total += int(rest.split()[0]) * 1024
    return total


def _mem_available() -> int:
    return _meminfo("MemAvailable")


KERNEL_FIELDS = ("Slab", "KernelStack", "PageTables", "Percpu")


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def idle(be: NamespaceBackend, spec: SandboxSpec, dev: BaselineInfo, n: int) -> object:
    avail0 = _mem_available()
    kern0 = _meminfo(*KERNEL_FIELDS)
    made: list[SandboxHandle] = []
    t = time.perf_counter()
    try:
        for _ in range(n):
            made.append(await be.create(spec, dev))
        created_s = time.perf_counter() - t
        await asyncio.sleep(1)
        alive = 0
        for h in made:
            alive += (await h.exec(["true"])).exit_code == 0
        pss = 0
        cg_usage = 0
        nprocs = 0
        for h in made:
            assert hasattr(h, "cgroup")
            for pid in h.cgroup.pids():
                pss += _pss(pid)
                nprocs += 1
            cg_usage += h.cgroup.memory_usage()
        avail1 = _mem_available()
        kern1 = _meminfo(*KERNEL_FIELDS)
    finally:
        t2 = time.perf_counter()
        for h in made:
            await h.destroy()
        destroy_all_s = time.perf_counter() - t2
    mib = 1 << 20
    return {
        "sandboxes": n,
        "alive_answering": alive,
        "processes": nprocs,
        "create_all_s": round(created_s, 2),
        "destroy_all_s": round(destroy_all_s, 2),
        "pss_per_sandbox_mib": round(pss / n / mib, 3),
        "memcg_usage_per_sandbox_mib": round(cg_usage / n / mib, 3),
        "memavailable_drop_per_sandbox_mib": round((avail0 - avail1) / n / mib, 3),
        "kernel_growth_per_sandbox_mib": round((kern1 - kern0) / n / mib, 3),
        "method": "PSS (smaps_rollup) of every process in the sandboxes' cgroups; "
        "memory cgroup usage_in_bytes (processes + tmpfs + kernel memory charged); "
        "growth of Slab+KernelStack+PageTables+Percpu (namespaces, mounts, sockets: "
        "host-wide, so other load adds noise); host MemAvailable before/after (noisiest)",
    }


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run as root")
    asyncio.run(main())
