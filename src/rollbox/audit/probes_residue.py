"""Residue after many create/destroy cycles: nothing on the host or in the orchestrator grows."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

from rollbox.audit.context import AuditContext, ProbeError
from rollbox.audit.registry import Outcome, probe, verdict
from rollbox.models import Limits
from rollbox.pilot.hostscope import capture, scoped_leaks
from rollbox.sandbox import AsyncSandbox

RSS_GROWTH_LIMIT_MB = 24.0
"""Allowed RSS growth of the orchestrator over all cycles (allocator noise, caches)."""
RSS_LATE_GROWTH_LIMIT_MB = 8.0
"""Allowed RSS growth over the second half of the cycles (a leak keeps growing)."""
FD_GROWTH_LIMIT = 2


def _proc_status(key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+)", Path("/proc/self/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def _others(ctx: AuditContext) -> set[str]:
    """Live sandboxes of this home that the audit did not make (other users of the home)."""
    try:
        return {d for d in os.listdir(ctx.home.sandboxes) if d not in ctx.created_ids}
    except FileNotFoundError:
        return set()


def gauges(ctx: AuditContext) -> dict[str, float]:
    """What must not grow: this home's mounts, cgroups and netns (those of sandboxes that
    other users of the home have alive right now excluded), and the orchestrator's fds,
    RSS and threads."""
    root, tag = str(ctx.home.root), ctx.home.tag
    others = _others(ctx)
    other_net: set[str] = set()
    try:
        from rollbox.backends.common import network as net

        other_net = {net.netns_name(tag, i) for i in others}
    except ImportError:
        pass

    def foreign(text: str) -> bool:
        return any(o in text for o in others)

    with open("/proc/self/mountinfo") as f:
        mounts = sum(1 for ln in f if root in ln and not foreign(ln))
    cgroups = 0
    for ctrl in Path("/sys/fs/cgroup").iterdir():
        try:
            for dirpath, dirs, _files in os.walk(ctrl):
                cgroups += sum(
                    1
                    for d in dirs
                    if (tag in d or tag in dirpath) and not foreign(os.path.join(dirpath, d))
                )
        except OSError:
            continue
    try:
        netns = sum(1 for n in os.listdir("/run/netns") if tag in n and n not in other_net)
    except FileNotFoundError:
        netns = 0
    return {
        "mounts": mounts,
        "cgroups": cgroups,
        "netns": netns,
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_mb": round(_proc_status("VmRSS") / 1024, 2),
        "threads": _proc_status("Threads"),
    }


async def _cycle(ctx: AuditContext) -> None:
    sbx = await AsyncSandbox.create(
        ctx.baseline,
        backend=ctx.backend,
        limits=Limits(memory_mb=128, disk_mb=64, pids=64),
        home=ctx.home,
    )
    ctx.created_ids.add(sbx.id)
    try:
        r = await sbx.exec(["true"])
        if r.exit_code != 0:
            raise ProbeError(f"exec of true exited {r.exit_code}")
    finally:
        await asyncio.shield(sbx.destroy())


@probe("residue-cycles", "host")
async def residue(ctx: AuditContext) -> Outcome:
    """After N create/destroy cycles, mounts, cgroups, netns, fds and RSS have not grown."""
    n = ctx.cycles
    if n <= 0:
        return Outcome("skip", "--cycles 0")
    warm = max(1, min(10, n // 10))
    for _ in range(warm):
        await _cycle(ctx)
    host_before = await asyncio.to_thread(capture, ctx.home)
    known = set(ctx.created_ids)
    g0 = gauges(ctx)
    mid: dict[str, float] = {}
    t0 = time.perf_counter()
    for i in range(n):
        await _cycle(ctx)
        if i == n // 2:
            mid = gauges(ctx)
    elapsed = time.perf_counter() - t0
    g1 = gauges(ctx)
    host_after = await asyncio.to_thread(capture, ctx.home)
    leaks = scoped_leaks(host_before, host_after, ctx.home, ctx.created_ids - known)
    breaches = []
    for k in ("mounts", "cgroups", "netns"):
        if g1[k] > g0[k]:
            breaches.append(f"{k} grew {g0[k]:g} -> {g1[k]:g}")
    if g1["fds"] - g0["fds"] > FD_GROWTH_LIMIT:
        breaches.append(f"orchestrator fds grew {g0['fds']:g} -> {g1['fds']:g}")
    if g1["rss_mb"] - g0["rss_mb"] > RSS_GROWTH_LIMIT_MB:
        breaches.append(f"orchestrator RSS grew {g0['rss_mb']} -> {g1['rss_mb']} MiB")
    if mid and g1["rss_mb"] - mid["rss_mb"] > RSS_LATE_GROWTH_LIMIT_MB:
        breaches.append(f"RSS still growing in the 2nd half: {mid['rss_mb']} -> {g1['rss_mb']}")
    if leaks:
        breaches.append(f"host resources left: {leaks}")
    out = verdict(
        breaches,
        f"{n} cycles in {elapsed:.1f} s ({elapsed / n * 1000:.0f} ms each): mounts "
        f"{g0['mounts']:g}->{g1['mounts']:g}, cgroups {g0['cgroups']:g}->{g1['cgroups']:g}, netns "
        f"{g0['netns']:g}->{g1['netns']:g}, fds {g0['fds']:g}->{g1['fds']:g}, RSS "
        f"{g0['rss_mb']}->{g1['rss_mb']} MiB",
    )
    out.evidence = {
        "cycles": n,
        "warmup_cycles": warm,
        "before": g0,
        "middle": mid,
        "after": g1,
        "host_leaks": leaks,
        "seconds": round(elapsed, 2),
    }
    return out
