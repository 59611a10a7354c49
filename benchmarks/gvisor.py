"""gvisor backend: create -> first exec result of ``true``, side by side with raw runsc.

Raw: ``runsc --network=none run --bundle B ID`` of ``true`` on an overlay of the same
baseline (bundle written once; the overlay is mounted fresh per run, like a sandbox's),
timed to the command's exit. rollbox: ``AsyncSandbox.create(backend="gvisor")`` followed by
``exec(["true"])``, timed to the result; then, separately, ``destroy()`` and the exec round
trip in a running sandbox. Runs alternate so both see the same machine load.

Usage: ``python benchmarks/gvisor.py [-n N]`` (root); writes benchmarks/results/gvisor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stats import stats_ms  # benchmarks/_stats.py (scripts run from benchmarks/)
from rollbox.backends.common.bundle import oci_config, write_bundle
from rollbox.backends.common.rootfs import Rootfs, remove_sandbox_dir
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import Limits
from rollbox.sandbox import AsyncSandbox

RESULTS = Path(__file__).with_name("results") / "gvisor.json"


def stats(xs: list[float]) -> dict[str, float]:
    """Median, p99 (nearest rank) and mean in milliseconds."""
    return stats_ms(xs)


def raw_runsc_once(work: Path, layers: list[Path], i: int) -> float:
    """One raw ``runsc run`` of ``true`` on a fresh overlay; returns seconds."""
    sdir = work / f"raw{i}"
    fs = Rootfs.mount(sdir, layers, 1024)
    try:
        write_bundle(
            sdir,
            oci_config(
                rootfs=fs.root,
                args=["/bin/true"],
                hostname="raw",
                limits=Limits(),
                cgroups_path=None,
                ro_binds={},
                rw_binds={},
            ),
        )
        argv = ["runsc", "--root", str(work / "state"), "--network=none", "run"]
        argv += ["--bundle", str(sdir), f"raw-{os.getpid()}-{i}"]
        t = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, check=False)
        dt = time.perf_counter() - t
        if proc.returncode != 0:
            raise RuntimeError(f"raw runsc failed: {proc.stderr.decode()[-300:]}")
        return dt
    finally:
        remove_sandbox_dir(sdir)


async def rollbox_once(baseline: str, home: Home) -> tuple[float, float]:
    """(create -> first exec seconds, destroy seconds)."""
    t = time.perf_counter()
    sbx = await AsyncSandbox.create(baseline, backend="gvisor", home=home)
    r = await sbx.exec(["true"])
    dt = time.perf_counter() - t
    if r.exit_code != 0:
        raise RuntimeError(f"true exited {r.exit_code}")
    t = time.perf_counter()
    await sbx.destroy()
    return dt, time.perf_counter() - t


async def exec_roundtrips(baseline: str, home: Home, n: int) -> list[float]:
    """Round trips of ``true`` in one running sandbox."""
    out = []
    async with await AsyncSandbox.create(baseline, backend="gvisor", home=home) as sbx:
        await sbx.exec(["true"])
        for _ in range(n):
            t = time.perf_counter()
            await sbx.exec(["true"])
            out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=10, help="runs of each (default 10)")
    ap.add_argument("--baseline", default=None, help="baseline ref (default: the default one)")
    args = ap.parse_args()
    home = Home.from_env().ensure()
    store = BaselineStore(home)
    info = store.default() if args.baseline is None else store.resolve(args.baseline)
    layers = store.layer_dirs(info.digest)
    work = Path(tempfile.mkdtemp(prefix="bench-gvisor-", dir=home.tmp))
    raw: list[float] = []
    ours: list[float] = []
    destroy: list[float] = []
    try:
        # Warm-up (agent build, page cache) not counted.
        raw_runsc_once(work, layers, -1)
        asyncio.run(rollbox_once(info.digest, home))
        for i in range(args.n):
            raw.append(raw_runsc_once(work, layers, i))
            c, d = asyncio.run(rollbox_once(info.digest, home))
            ours.append(c)
            destroy.append(d)
        rtt = asyncio.run(exec_roundtrips(info.digest, home, max(20, args.n * 2)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r, o = stats(raw), stats(ours)
    result = {
        "benchmark": "gvisor",
        "host": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": sys.version.split()[0],
        },
        "runsc": subprocess.run(
            ["runsc", "--version"], capture_output=True, text=True
        ).stdout.split("\n")[0],
        "baseline": info.digest,
        "create_first_exec": {
            "raw_runsc_run_true": r,
            "rollbox_gvisor": o,
            "ratio_p50": round(o["p50_ms"] / r["p50_ms"], 2),
            "target_ratio": 1.5,
        },
        "destroy": stats(destroy),
        "exec_roundtrip": stats(rtt),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
