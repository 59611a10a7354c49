"""Runs inside the cgroup-v2 guest (see ``guest.py``); prints one JSON document.

Usage: ``python3 guest_driver.py info|conformance|limits|bench [BACKEND...]``. It uses
rollbox from ``/opt/rbx/src`` with the home ``/var/lib/rbx-home`` whose store holds the
Debian baseline. Not collected by pytest (no ``test_`` prefix): the host-side tests in
``test_cgroup_v2.py`` run it and assert on its output.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HOME = "/var/lib/rbx-home"
SLEEPERS = (
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
    " | grep -c '^sleep 1000' || true"
)
"""Count the ``sleep 1000`` processes inside (the baseline has no procps)."""
KILL_SLEEPERS = (
    "for p in /proc/[0-9]*; do read c < $p/comm 2>/dev/null || continue; "
    '[ "$c" = sleep ] && kill -9 ${p#/proc/}; done; true'
)
T0 = time.monotonic()


def log(msg: str) -> None:
    """Progress on stderr (streamed to the host test's log)."""
    print(f"[guest {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _setup(root: str = HOME) -> Any:
    os.environ["ROLLBOX_HOME"] = root
    from rollbox.baselines.store import BaselineStore
    from rollbox.config import Home

    home = Home(Path(root)).ensure()
    return home, BaselineStore(home).default()


def info() -> dict[str, Any]:
    from rollbox.backends.common import cgroups, cgroups_v2

    out: dict[str, Any] = {
        "kernel": platform.release(),
        "mode": cgroups.cgroup_mode(),
        "version": cgroups.cgroup_version(),
        "own_cgroup": cgroups_v2._own_cgroup(),
    }
    try:
        base = cgroups_v2.ensure_base()
        out["base"] = str(base)
        out["available"] = sorted(cgroups_v2.available())
        out["own_cgroup_after"] = cgroups_v2._own_cgroup()
        out["base_procs"] = (base / "cgroup.procs").read_text().split()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def conformance(backends: list[str], only: list[str] | None = None) -> dict[str, Any]:
    from rollbox.backends.conformance import CHECKS, run_check_sync
    from rollbox.backends.registry import get_backend

    home, baseline = _setup()
    results: dict[str, Any] = {}
    for name in backends:
        be = get_backend(name, home)
        try:
            be.prepare()
        except Exception as exc:
            results[name] = {"unavailable": f"{type(exc).__name__}: {exc}"}
            continue
        res: dict[str, Any] = {}
        for check in only or list(CHECKS):
            log(f"{name}: {check}")
            t0 = time.monotonic()
            try:
                run_check_sync(check, be, baseline)
                res[check] = {"ok": True}
            except BaseException as exc:
                tb = "".join(traceback.format_exception(exc)[-4:]).strip()
                res[check] = {"ok": False, "error": tb[-1500:]}
            res[check]["s"] = round(time.monotonic() - t0, 2)
        results[name] = res
    return results


async def _limits(backend: str) -> dict[str, Any]:
    from rollbox.backends.common.cgroups import Cgroup
    from rollbox.backends.registry import get_backend
    from rollbox.errors import ExecTimeoutError
    from rollbox.models import Limits, SandboxSpec

    home, baseline = _setup()
    be = get_backend(backend, home)
    be.prepare()
    out: dict[str, Any] = {}
    lim = Limits(cpus=0.5, memory_mb=64, pids=64)
    spec = SandboxSpec(baseline=baseline.digest, backend=backend, limits=lim)
    h = await be.create(spec, baseline)
    try:
        cg = Cgroup.open(home.tag, h.id)
        d = cg.paths["memory"]
        out["cgroup_dir"] = str(d)
        out["files"] = {
            f: (d / f).read_text().strip()
            for f in ("memory.max", "memory.swap.max", "pids.max", "cpu.max")
            if (d / f).exists()
        }
        out["sandbox_procs_in_main"] = (d / "main" / "cgroup.procs").read_text().split()
        # a memory hog is OOM-killed and recorded as such
        log("memory hog")
        r = await h.exec(["python3", "-c", "x = bytearray(400 << 20); print(len(x))"])
        out["hog"] = {"exit": r.exit_code, "oom_killed": r.oom_killed, "oom_kills": cg.oom_kills()}
        # fork bomb stopped by pids.max, counted
        log("fork bomb")
        r = await h.exec("for i in $(seq 200); do sleep 30 & done; wait", timeout=60)
        out["forks"] = {
            "exit": r.exit_code,
            "cannot_fork": "fork" in r.stderr.lower(),
            "pids_max_hits": cg.pids_max_hits(),
        }
        await h.exec(KILL_SLEEPERS)  # the sleeps that did start
        # pause freezes, resume thaws: a counter stops, then moves on
        log("pause/resume")
        await h.exec(
            "setsid sh -c 'echo $$ > /tmp/c.pid; i=0; while true; do i=$((i+1)); "
            "echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done' >/dev/null 2>&1 &"
        )
        for _ in range(300):  # the first write can take a while under TCG
            if (await h.exec("test -s /tmp/c")).exit_code == 0:
                break
            await asyncio.sleep(0.1)
        await h.pause()
        events = (d / "cgroup.events").read_text()
        c1 = (await h.read_file("/tmp/c")).strip()
        await asyncio.sleep(2.0)
        c2 = (await h.read_file("/tmp/c")).strip()
        await h.resume()
        c3 = c2
        for _ in range(200):  # the counter moves on (slowly under TCG with cpus=0.5)
            await asyncio.sleep(0.1)
            c3 = (await h.read_file("/tmp/c")).strip()
            if c3 != c2:
                break
        out["pause"] = {
            "frozen_event": "frozen 1" in events,
            "paused_counts": [int(c1), int(c2)],
            "after_resume": int(c3),
            "frozen_after_resume": cg.is_frozen(),
        }
        await h.exec("kill -9 $(cat /tmp/c.pid)")
        await asyncio.sleep(0.5)
        # a timeout kills a setsid daemon tree
        log("timeout kill")
        before = set(cg.pids())
        t0 = time.monotonic()
        try:
            await h.exec("setsid sh -c 'sleep 1000 & sleep 1000' & sleep 1000", timeout=2)
            out["timeout"] = {"raised": False}
        except ExecTimeoutError:
            await asyncio.sleep(0.2)
            survivors = (await h.exec(SLEEPERS)).stdout.strip()
            out["timeout"] = {
                "raised": True,
                "s": round(time.monotonic() - t0, 2),
                "sleep_survivors": int(survivors or 0),
                "new_pids_left": sorted(set(cg.pids()) - before),
            }
    finally:
        await h.destroy()
    out["after_destroy_exists"] = Cgroup.open(home.tag, h.id).exists()
    parent = Path(out["cgroup_dir"]).parent
    out["parent_left"] = sorted(os.listdir(parent)) if parent.is_dir() else None
    return out


def limits(backends: list[str]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for b in backends:
        try:
            res[b] = asyncio.run(_limits(b))
        except BaseException as exc:
            res[b] = {"error": "".join(traceback.format_exception(exc))[-1500:]}
    return res


async def bench(n: int, root: str = HOME) -> dict[str, Any]:
    """Median create -> first exec of ``true`` vs raw bwrap (alternating), and the exec
    round trip, in the home ``root`` (also run on the host by benchmarks/cgroup_v2.py)."""
    from rollbox.backends.registry import get_backend
    from rollbox.baselines.store import BaselineStore
    from rollbox.models import SandboxSpec

    home, baseline = _setup(root)
    layer = BaselineStore(home).layer_dirs(baseline.digest)[0]
    bwrap = shutil.which("bwrap") or "bwrap"
    raw_argv = [bwrap, "--bind", str(layer), "/", "--dev", "/dev", "--proc", "/proc"]
    raw_argv += ["--unshare-all", "--die-with-parent", "true"]
    be = get_backend("namespace", home)
    be.prepare()
    spec = SandboxSpec(baseline=baseline.digest, backend="namespace")
    raw: list[float] = []
    first: list[float] = []
    rt: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(raw_argv, check=True)
        raw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        h = await be.create(spec, baseline)
        r = await h.exec(["true"])
        first.append(time.perf_counter() - t0)
        assert r.exit_code == 0
        for _ in range(5):
            t1 = time.perf_counter()
            await h.exec(["true"])
            rt.append(time.perf_counter() - t1)
        await h.destroy()

    def q(xs: list[float], f: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(len(xs) * f))] * 1000

    from rollbox.backends.common.cgroups import cgroup_mode

    return {
        "cgroup_mode": cgroup_mode(),
        "kernel": platform.release(),
        "raw_command": " ".join(raw_argv),
        "n": n,
        "raw_bwrap_ms": {"p50": round(q(raw, 0.5), 2), "p99": round(q(raw, 0.99), 2)},
        "create_first_exec_ms": {"p50": round(q(first, 0.5), 2), "p99": round(q(first, 0.99), 2)},
        "ratio_p50": round(q(first, 0.5) / q(raw, 0.5), 2),
        "exec_round_trip_ms": {"p50": round(q(rt, 0.5), 2), "p99": round(q(rt, 0.99), 2)},
    }


OWNER = """
import asyncio, os, sys
sys.path[:0] = {path!r}
os.environ["ROLLBOX_HOME"] = {home!r}
from rollbox.backends.registry import get_backend
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import SandboxSpec
home = Home(__import__("pathlib").Path({home!r}))
b = BaselineStore(home).default()
be = get_backend("namespace", home)
h = asyncio.run(be.create(SandboxSpec(baseline=b.digest, backend="namespace"), b))
asyncio.run(h.exec("setsid sleep 1000 >/dev/null 2>&1 &"))
print(h.id, flush=True)
sys.stdin.read()  # until SIGKILLed
"""


def sigkill_cleanup() -> dict[str, Any]:
    """A process that made a sandbox (with a daemon inside) is SIGKILLed; ``rollbox
    cleanup``'s library call then removes everything: cgroup groups, mounts, processes."""
    from rollbox.backends.common.cgroups import Cgroup, v2_groups
    from rollbox.backends.registry import get_backend
    from rollbox.hoststate import HostState

    home, _ = _setup()
    before = HostState.capture(home.sandboxes)
    code = OWNER.format(path=sys.path, home=HOME)
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    sid = owner.stdout.readline().strip()
    cg = Cgroup.open(home.tag, sid)
    alive = {"exists": cg.exists(), "pids": len(cg.pids()), "groups": sorted(v2_groups())}
    owner.kill()
    owner.wait()
    lines = get_backend("namespace", home).cleanup_orphans()
    after = HostState.capture(home.sandboxes)
    return {
        "sandbox": sid,
        "while_alive": alive,
        "cleanup": lines,
        "after_exists": cg.exists(),
        "leaks": before.diff(after),
    }


def microvm_cgroup() -> dict[str, Any]:
    """The microvm backend's host-cgroup lines on v2 (no QEMU in here: a stand-in process
    takes QEMU's place in the group)."""
    from rollbox.backends.common.cgroups import Cgroup
    from rollbox.backends.microvm.backend import _drop_host_cgroup, _host_cgroup
    from rollbox.models import Limits, SandboxSpec

    home, baseline = _setup()
    proc = subprocess.Popen(["sleep", "1000"])
    sid = "sbx-v2microvmcgroup"
    spec = SandboxSpec(baseline=baseline.digest, backend="microvm", limits=Limits(cpus=0.25))
    _host_cgroup(home, sid, spec, proc.pid)
    cg = Cgroup.open(home.tag, sid)
    own = Path(f"/proc/{proc.pid}/cgroup").read_text().strip()
    out = {
        "proc_cgroup": own,
        "cpu.max": (cg.paths["cpu"] / "cpu.max").read_text().strip(),
        "dropped": _drop_host_cgroup(home, sid),
        "after_exists": cg.exists(),
    }
    out["proc_exit"] = proc.wait(timeout=10)
    return out


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "info":
        doc: Any = info()
    elif cmd == "conformance":
        names = [a for a in args if not a.startswith("--only=")] or ["namespace"]
        only = [c for a in args if a.startswith("--only=") for c in a[7:].split(",")]
        doc = conformance(names, only or None)
    elif cmd == "limits":
        doc = limits(args or ["namespace"])
    elif cmd == "sigkill-cleanup":
        doc = sigkill_cleanup()
    elif cmd == "microvm-cgroup":
        doc = microvm_cgroup()
    elif cmd == "bench":
        doc = asyncio.run(bench(int(args[0]) if args else 10))
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    print("RBX-JSON " + json.dumps(doc))


if __name__ == "__main__":
    main()
