"""A Debian rootfs for benchmarks, made from a clean clone (no file from outside the repo).

The default baseline (Debian bookworm + python3, bootstrapped by mmdebstrap on first use) is
kept in a benchmark home, ``$ROLLBOX_BENCH_HOME`` (default ``/var/tmp/rollbox-bench-home``), so
the bootstrap happens once per machine. Raw-tool comparisons use its unpacked layer directory
directly (read-only) or a tar of it, written once next to the home.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import BaselineInfo

BENCH_HOME = Path(os.environ.get("ROLLBOX_BENCH_HOME", "/var/tmp/rollbox-bench-home"))


def debian_baseline() -> tuple[BaselineStore, BaselineInfo]:
    """The default Debian baseline in the benchmark home (bootstrapped on first use)."""
    store = BaselineStore(Home(BENCH_HOME).ensure())
    return store, store.default()


def debian_rootfs_dir() -> Path:
    """The unpacked root filesystem of the default baseline (one layer; never write to it)."""
    store, info = debian_baseline()
    dirs = store.layer_dirs(info.digest)
    if len(dirs) != 1:
        raise SystemExit(f"expected a one-layer default baseline, got {len(dirs)} layers")
    return dirs[0]


def debian_rootfs_tar() -> Path:
    """A plain tar of the default baseline's root filesystem (made once, then reused)."""
    root = debian_rootfs_dir()
    out = BENCH_HOME / f"rootfs-{root.name[:16]}.tar"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        subprocess.run(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(tmp), "."],
            check=True,
        )
        tmp.rename(out)
    return out
