"""Conformance checks of limits: pids, memory, disk, timeouts."""

from __future__ import annotations

import asyncio

from rollbox.backends.conformance.harness import Harness, check, sh
from rollbox.errors import (
    ExecTimeoutError,
    SandboxCrashedError,
    SandboxStateError,
)
from rollbox.models import Limits


async def fork_bomb(t: Harness) -> None:
    """A fork bomb is held by the pids limit; its timeout kills all of it; the host and a
    sibling sandbox stay usable meanwhile. (A user-space kernel that dies of the bomb may
    report its sandbox crashed instead; the damage must still stay inside.)"""
    sibling = await t.create()
    h = await t.create(limits=Limits(pids=64))
    crashed = False
    try:
        # The sleeper starts first: once the bomb fills the pids limit nothing can fork. The
        # bomb runs in a subshell because dash exits on a failed fork: in the main shell that
        # ended the exec early whenever the limit was hit before its own last fork.
        r = await h.exec("sleep 30 & s=$!; (b() { b | b & }; b); wait $s", timeout=3)
    except ExecTimeoutError:
        pass
    except SandboxCrashedError:
        crashed = True
    else:
        raise AssertionError(f"the fork bomb's exec did not time out: {r}")
    check(await sh(sibling, "echo alive") == "alive\n", "a sibling sandbox was starved")
    # user processes only (a VM also lists its kernel threads, whose cmdline is empty)
    count = "grep -l . /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
    for _ in range(20):  # killed processes may take a moment to be reaped
        try:
            r = await h.exec(["sh", "-c", count], timeout=20)
        except (SandboxCrashedError, SandboxStateError) as exc:
            check(crashed or "crashed" in str(exc), f"sandbox unusable after the bomb: {exc}")
            return
        check(not crashed, "the exec reported a crash but the sandbox still answers")
        if r.exit_code == 0 and int(r.stdout) < 20:
            return
        await asyncio.sleep(0.2)
    ps = (await h.exec("ps -eo pid,ppid,stat,args | head -8")).stdout
    raise AssertionError(f"bomb survivors: {r.stdout.strip()}: {ps}")


async def memory_hog(t: Harness) -> None:
    """A memory hog is OOM-killed and reported; the damage stays inside its sandbox (a
    sibling sandbox keeps working; the hog's own sandbox either keeps answering or, with a
    user-space kernel that dies of it, reports itself crashed)."""
    sibling = await t.create()
    h = await t.create(limits=Limits(memory_mb=64))
    r = await h.exec(["python3", "-c", "a = bytearray(400 << 20); print(len(a))"], timeout=60)
    check(r.exit_code != 0 and r.oom_killed, f"hog not OOM-killed: {r}")
    check(await sh(sibling, "echo alive") == "alive\n", "a sibling sandbox was hit")
    try:
        r = await h.exec(["echo", "alive"])
    except SandboxStateError as exc:
        check("crashed" in str(exc), f"unexpected state after OOM: {exc}")
    else:
        check(r.stdout == "alive\n", "sandbox unusable after the hog")


async def disk_filler(t: Harness) -> None:
    """Writing past the disk limit fails inside with ENOSPC."""
    h = await t.create(limits=Limits(disk_mb=16))
    r = await h.exec("dd if=/dev/zero of=/tmp/big bs=1M count=64", timeout=60)
    check(r.exit_code != 0 and "No space left" in r.stderr, f"disk not limited: {r}")
    r = await h.exec("du -sm /tmp/big | cut -f1")
    check(int(r.stdout.strip() or 0) <= 16, f"wrote {r.stdout.strip()} MB past a 16 MB limit")


async def timeout_no_survivors(t: Harness) -> None:
    """A timed-out exec's whole tree dies, setsid daemons included."""
    h = await t.create()
    try:
        await h.exec("setsid sleep 301 & (sleep 302 &) ; sleep 303", timeout=1)
    except ExecTimeoutError:
        pass
    else:
        raise AssertionError("no ExecTimeoutError")
    r = await h.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    check(not any(f"sleep 30{i}" in r.stdout for i in (1, 2, 3)), f"survivors: {r.stdout}")
