"""Preflight of the disk limit against what this host can hold.

``disk_mb`` sizes a sandbox's writable layer. Where that layer lives depends on the backend:
a tmpfs (namespace, gvisor: it is held in RAM and swap) or a file under the data home
(microvm: a qcow2 overlay that grows on the home's filesystem). A limit the host cannot hold
would be accepted and then fail as a full disk in the middle of a rollout, blamed on the
agent; it is refused up front instead, naming the limit and what the host offers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from rollbox.errors import LimitsError
from rollbox.models import Limits


def tmpfs_capacity_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """RAM + swap of this host in MiB: the most a tmpfs can ever hold."""
    total_kb = 0
    for line in meminfo.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "SwapTotal"):
            total_kb += int(rest.split()[0])
    return total_kb // 1024


def free_disk_mb(path: Path) -> int:
    """Free space (for unprivileged writers) of the filesystem holding ``path`` in MiB; a
    path that does not exist yet is measured at its nearest existing parent."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize // (1 << 20)


def check_disk(
    limits: Limits, backing: Literal["tmpfs", "file"], home_root: Path | None = None
) -> None:
    """Refuse a ``disk_mb`` this host cannot hold.

    Args:
        limits: the requested limits (``disk_mb`` None means unlimited: nothing to check).
        backing: ``tmpfs`` (the writable layer is held in RAM + swap) or ``file`` (it grows
            on the filesystem of ``home_root``).
        home_root: the data home, for ``file``.

    Raises:
        LimitsError: naming disk_mb and what the host offers.
    """
    if limits.disk_mb is None:
        return
    if backing == "tmpfs":
        cap = tmpfs_capacity_mb()
        if limits.disk_mb > cap:
            raise LimitsError(
                f"disk_mb={limits.disk_mb} exceeds this host's RAM + swap ({cap} MiB), which"
                " holds the sandbox's writable layer",
                hint=f"use disk_mb <= {cap}",
            )
        return
    if home_root is None:
        raise ValueError("check_disk(backing='file') needs home_root")
    free = free_disk_mb(home_root)
    if limits.disk_mb > free:
        raise LimitsError(
            f"disk_mb={limits.disk_mb} exceeds the free disk under {home_root} ({free} MiB)",
            hint=f"use disk_mb <= {free} or free some space",
        )
