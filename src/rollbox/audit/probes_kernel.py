"""Probes against the kernel surface: /proc, fds, signals, ptrace, sysctls, devices, syscalls."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
from pathlib import Path
from typing import Any

from rollbox.audit import scripts
from rollbox.audit.context import AuditContext, ProbeError, token
from rollbox.audit.registry import Outcome, probe, verdict
from rollbox.errors import RollboxError

_DENIED = {"EPERM", "EACCES", "EROFS", "ENOSYS", "ENOENT", "EINVAL", "ENOTTY", "ENXIO", "EIO"}


def own_kernel_note(accepted: list[str]) -> str:
    """How actions accepted by a kernel that is not the host's are reported."""
    if not accepted:
        return ""
    return f"; accepted by the sandbox's own kernel (not the host's): {accepted}"


@probe("proc-environ", "kernel")
async def proc_environ(ctx: AuditContext) -> Outcome:
    """No /proc/*/environ readable inside holds a host process's secret."""
    a, _ = await ctx.shared()
    if not ctx.canary_alive():
        raise ProbeError("the host canary process is not running")
    res = await ctx.py(a, scripts.SCAN_PROCS, {"tokens": [ctx.env_token]})
    breaches = []
    if res["environ_hits"] or res["cmdline_hits"]:
        breaches.append(f"host process environment readable inside (pids {res['environ_hits']})")
    out = verdict(
        breaches,
        f"{res['environ_readable']} environ files readable inside, none holds the host "
        "canary process's secret",
    )
    out.evidence = {
        "host_canary_pid": ctx.canary_proc.pid if ctx.canary_proc else None,
        "processes_inside": res["processes"],
        "environ_readable": res["environ_readable"],
    }
    return out


def host_path_markers(ctx: AuditContext) -> list[str]:
    """Host paths that must not appear in a sandbox's mountinfo.

    Precisely: the home root (as given and resolved), every baseline layer directory, the
    home's ``sandboxes/`` directory (a sandbox's own host directory lies below it), the
    system-wide default home, and the audit's host canary directory.
    """
    marks = {
        str(ctx.home.root),
        os.path.realpath(ctx.home.root),
        str(ctx.home.sandboxes),
        "/var/lib/rollbox",
        str(ctx.canary_dir),
    }
    marks.update(str(d) for d in ctx.layer_dirs)
    return sorted(m for m in marks if m and m != "/")


@probe("mountinfo-host-paths", "kernel")
async def mountinfo(ctx: AuditContext) -> Outcome:
    """/proc/self/mountinfo inside names no host path under ROLLBOX_HOME (layers, sandbox dir)."""
    a, _ = await ctx.shared()
    text = (await ctx.py(a, scripts.MOUNTINFO))["mountinfo"]
    if not text.strip():
        raise ProbeError("/proc/self/mountinfo is empty inside")
    marks = host_path_markers(ctx)
    leaks = [ln for ln in text.splitlines() if any(m in ln for m in marks)]
    out = verdict(
        [f"{len(leaks)} mountinfo lines name host paths: {leaks[:3]}"] if leaks else [],
        f"{len(text.splitlines())} mountinfo lines, none names any of {len(marks)} host paths",
    )
    out.evidence = {"mountinfo": text.splitlines(), "forbidden": marks, "leaking_lines": leaks}
    return out


@probe("inherited-fds", "kernel")
async def inherited_fds(ctx: AuditContext) -> Outcome:
    """An exec holds only fds 0, 1 and 2."""
    a, _ = await ctx.shared()
    res = await ctx.py(a, scripts.FDS)
    fds = {int(k): v for k, v in res["fds"].items()}
    extra = {k: v for k, v in fds.items() if k > 2}
    out = verdict(
        [f"extra fds inherited: {extra}"] if extra else [], f"only fds {sorted(fds)} open"
    )
    out.evidence = {"fds": fds}
    return out


@probe("kill-all", "kernel")
async def kill_all(ctx: AuditContext) -> Outcome:
    """``kill -9 -1`` as root inside kills nothing outside the sandbox."""
    a, b = await ctx.shared()
    marker = await ctx.py(b, scripts.START_MARKER, {"seconds": "2999.5"})
    if not marker["marker_pids"]:
        raise ProbeError(f"could not start a marker process in B: {marker}")
    if not ctx.canary_alive():
        raise ProbeError("the host canary process is not running")
    k = await ctx.sandbox()
    try:
        res = await ctx.py(k, scripts.KILL_ALL)
    except RollboxError as exc:  # the sandbox may well kill its own exec machinery
        res = {"kill_-1": f"sandbox K's own exec died ({type(exc).__name__})"}
    breaches = []
    b_after: dict[str, Any] = {"cmdline_hits": []}
    try:
        b_after = await ctx.py(b, scripts.SCAN_PROCS, {"tokens": ["2999.5"]})
        if not b_after["cmdline_hits"]:
            breaches.append("sandbox B's process killed")
    except RollboxError as exc:  # B's own agent was killed too
        breaches.append(f"sandbox B died ({exc.one_line()})")
    try:
        if (await a.exec(["true"])).exit_code != 0:
            breaches.append("sandbox A stopped answering")
    except RollboxError as exc:
        breaches.append(f"sandbox A died ({exc.one_line()})")
    if not ctx.canary_alive():
        breaches.append("host canary process killed")
    out = verdict(
        breaches,
        f"kill(-1, SIGKILL) inside returned {res['kill_-1']}; host canary, A and B unharmed",
    )
    out.evidence = {
        "kill_result": res,
        "b_marker_before": marker["marker_pids"],
        "b_marker_after": b_after["cmdline_hits"],
    }
    return out


def _tracer_pid(pid: int) -> int | None:
    try:
        m = re.search(r"^TracerPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


PTRACE_HOLD_S = 2.0
"""How long the probe program keeps a successful attach to a host pid while the host
watches that process's TracerPid."""


@probe("ptrace", "kernel")
async def ptrace(ctx: AuditContext) -> Outcome:
    """PTRACE_ATTACH reaches no process outside the sandbox (host canary by its real pid)."""
    a, _ = await ctx.shared()
    host_pid = ctx.canary_proc.pid if ctx.canary_proc else 0
    before = _tracer_pid(host_pid) if host_pid else None
    if before is None or not ctx.canary_alive():
        raise ProbeError("the host canary process is not running (nothing to attach to)")
    if before != 0:
        raise ProbeError(f"the host canary is already traced (TracerPid {before})")
    # The program holds any attach it gets for PTRACE_HOLD_S; watch TracerPid meanwhile
    # (after it exits the kernel detaches, so a read afterwards proves nothing).
    run = asyncio.create_task(
        ctx.py(a, scripts.PTRACE, {"host_pids": [host_pid], "hold": PTRACE_HOLD_S})
    )
    seen: set[int] = set()
    polls = 0
    while not run.done():
        tracer = _tracer_pid(host_pid)
        polls += 1
        if tracer:
            seen.add(tracer)
        await asyncio.sleep(0.02)
    res = await run
    after = _tracer_pid(host_pid)
    breaches = []
    if seen:
        breaches.append(f"host canary got traced (TracerPid {sorted(seen)})")
    if after:
        breaches.append(f"host canary still traced after the probe (TracerPid {after})")
    if not ctx.canary_alive():
        breaches.append("host canary died")
    own_child = res["attach"].get(str(res["child"]))
    out = verdict(
        breaches,
        f"attach to own child: {own_child}; to pid 1: {res['attach'].get('1')}; to the host "
        f"canary's pid: {res['attach'].get(str(host_pid))}; host canary untraced over "
        f"{polls} TracerPid reads",
    )
    out.evidence = {
        "attach_results": res["attach"],
        "held_inside": res["held"],
        "host_canary_tracer_pids_seen": sorted(seen),
        "tracer_pid_reads": polls,
    }
    return out


_KNOBS = [
    "/proc/sys/kernel/panic",
    "/proc/sys/vm/swappiness",
    "/proc/sys/kernel/sched_autogroup_enabled",
]
_SYS_KNOBS = [
    "/sys/kernel/mm/ksm/pages_to_scan",
    "/sys/kernel/mm/ksm/sleep_millisecs",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/pages_to_scan",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
]


def _read(p: str) -> str | None:
    try:
        return Path(p).read_text().strip()
    except OSError:
        return None


async def _knob_probe(ctx: AuditContext, knobs: list[str], mkdirs: list[str]) -> Outcome:
    a, _ = await ctx.shared()
    before = {p: _read(p) for p in knobs}
    writes = []
    for p, v in before.items():
        if v is not None and v.lstrip("-").isdigit():
            writes.append([p, str(int(v) + 1)])
    if not writes and not mkdirs:
        raise ProbeError(f"no host value to compare with: {before}")
    res = await ctx.py(a, scripts.WRITE_KNOBS, {"writes": writes, "mkdirs": mkdirs})
    after = {p: _read(p) for p in knobs}
    changed = {p: (before[p], after[p]) for p in knobs if before[p] != after[p]}
    for p, (old, _new) in changed.items():  # put the host back as it was
        with contextlib.suppress(OSError):
            Path(p).write_text(str(old))
    made = [d for d in mkdirs if Path(d).exists()]
    for d in made:
        with contextlib.suppress(OSError):
            os.rmdir(d)
    accepted = [p for p, r in res["result"].items() if r in ("WROTE", "MKDIR")]
    breaches = []
    if changed:
        breaches.append(f"host settings changed from inside: {changed}")
    if made or any(r == "MKDIR" for r in res["result"].values()):
        breaches.append(f"host directories created from inside: {made}")
    note = (
        f"; writes accepted only by the sandbox's own kernel, host unchanged: {accepted}"
        if accepted and not breaches
        else ""
    )
    out = verdict(breaches, f"writes refused ({res['result']}); host values unchanged{note}")
    out.evidence = {"inside": res["result"], "host_before": before, "host_after": after}
    return out


@probe("proc-sys-write", "kernel")
async def proc_sys_write(ctx: AuditContext) -> Outcome:
    """Writes to /proc/sys knobs from inside never change the host's values."""
    return await _knob_probe(ctx, [k for k in _KNOBS if Path(k).exists()], [])


@probe("sys-write", "kernel")
async def sys_write(ctx: AuditContext) -> Outcome:
    """Writes to /sys (kernel knobs, a new cgroup) from inside never reach the host."""
    cg = f"/sys/fs/cgroup/pids/{token('cg')}"
    return await _knob_probe(ctx, [k for k in _SYS_KNOBS if Path(k).exists()], [cg])


@probe("mknod", "kernel")
async def mknod(ctx: AuditContext) -> Outcome:
    """Device nodes made inside cannot read the host's memory or disk."""
    a, _ = await ctx.shared()
    st = os.stat("/")
    nodes = [
        ["mem", "c", 1, 1],
        ["kmem", "c", 1, 2],
        ["hostroot", "b", os.major(st.st_dev), os.minor(st.st_dev)],
    ]
    res = await ctx.py(a, scripts.MKNOD, {"nodes": nodes})
    reads = {
        n: r["open_read"] for n, r in res["nodes"].items() if r["open_read"].startswith("READ")
    }
    # A node made at all is the breach on the host's kernel: whether it can then be read
    # depends on the host (here even host root may be refused /dev/vda), not the sandbox.
    made = sorted(n for n, r in res["nodes"].items() if r["mknod"] == "OK")
    shared = ctx.shared_kernel
    breaches = []
    if shared and reads:
        breaches.append(f"host device read through a node made inside: {reads}")
    if shared and made:
        breaches.append(f"host memory/disk device nodes made inside: {made}")
    out = verdict(
        breaches,
        "mknod/open of /dev/mem, /dev/kmem and the host root disk's numbers: "
        + ", ".join(f"{n} {r['mknod']}/{r['open_read']}" for n, r in res["nodes"].items())
        + ("" if shared else own_kernel_note(sorted(set(reads) | set(made)))),
    )
    out.evidence = {
        "nodes": res["nodes"],
        "host_root_dev": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
    }
    return out


@probe("mount", "kernel")
async def mount(ctx: AuditContext) -> Outcome:
    """mount(2) of tmpfs, proc and a bind of / is refused by the host's kernel."""
    a, _ = await ctx.shared()
    res = (await ctx.py(a, scripts.MOUNT))["mount"]
    # A new mount namespace alone changes nothing; a mount that succeeds is the breach.
    ok = [k for k, v in res.items() if v == "OK" and not k.startswith("unshare")]
    shared = ctx.shared_kernel
    out = verdict(
        [f"mounts allowed on the host's kernel: {ok}"] if ok and shared else [],
        f"results: {res}" + ("" if shared else own_kernel_note(ok)),
    )
    out.evidence = {"results": res}
    return out


def _host_keys_with(desc: str) -> list[str]:
    try:
        return [ln for ln in Path("/proc/keys").read_text().splitlines() if desc in ln]
    except OSError:
        return []


@probe("keyctl", "kernel")
async def keyctl(ctx: AuditContext) -> Outcome:
    """A key added inside never lands in the host kernel's keyrings."""
    a, _ = await ctx.shared()
    desc = token("key")
    res = await ctx.py(a, scripts.KEYCTL, {"desc": desc, "token": token("payload")})
    host = _host_keys_with(desc)
    for line in host:  # remove it again
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall(250, 21, int(line.split()[0], 16))  # KEYCTL_INVALIDATE
    breaches = [f"key visible in the host's /proc/keys: {host}"] if host else []
    out = verdict(
        breaches,
        f"add_key: {res['add_key']}, keyctl: {res['keyctl_get_keyring_id']}; "
        "host keyrings untouched",
    )
    out.evidence = {"inside": res, "host_proc_keys_hits": host}
    return out


@probe("bpf", "kernel")
async def bpf(ctx: AuditContext) -> Outcome:
    """bpf(BPF_MAP_CREATE) is refused by the host's kernel."""
    a, _ = await ctx.shared()
    res = await ctx.py(a, scripts.BPF)
    ok = res["bpf_map_create"] == "OK"
    shared = ctx.shared_kernel
    out = verdict(
        ["bpf map created in the host's kernel"] if ok and shared else [],
        f"bpf(BPF_MAP_CREATE): {res['bpf_map_create']}"
        + ("" if shared else own_kernel_note(["bpf"] if ok else [])),
    )
    out.evidence = res
    return out


@probe("tiocsti", "kernel")
async def tiocsti(ctx: AuditContext) -> Outcome:
    """TIOCSTI cannot inject input into any host terminal reachable inside."""
    a, _ = await ctx.shared()
    res = await ctx.py(a, scripts.TIOCSTI)
    inj = [k for k, v in res["tiocsti"].items() if v == "INJECTED"]
    shared = ctx.shared_kernel
    out = verdict(
        [f"input injected via {inj}"] if inj and shared else [],
        f"TIOCSTI: {res['tiocsti']}" + ("" if shared else own_kernel_note(inj)),
    )
    out.evidence = res
    return out
