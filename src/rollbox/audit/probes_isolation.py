"""Conformance probes: what one sandbox does must not reach another, the host or the baseline."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import subprocess
from pathlib import Path
from typing import Any

from rollbox.audit import scripts
from rollbox.audit.context import AuditContext, ProbeError, token
from rollbox.audit.registry import Outcome, probe, verdict
from rollbox.errors import ExecTimeoutError, SandboxCrashedError, SandboxStateError
from rollbox.models import ExecResult, Limits


@probe("cross-sandbox-files", "conformance")
async def cross_files(ctx: AuditContext) -> Outcome:
    """A file written in sandbox A is invisible to sandbox B and absent from the baseline."""
    a, b = await ctx.shared()
    tok = token("file")
    name = f"{tok}.txt"
    paths = [f"/tmp/{name}", f"/root/{name}", f"/var/tmp/{name}", f"/etc/{name}"]
    wrote = await ctx.py(a, scripts.WRITE_FILES, {"paths": paths, "token": tok})
    await a.files.write(f"/opt/{name}", tok)
    paths.append(f"/opt/{name}")
    seen_a = await ctx.py(a, scripts.EXISTS, {"paths": paths})
    if not all(seen_a["exists"].values()):
        raise ProbeError(f"A cannot see its own files: {seen_a['exists']}")
    seen_b = await ctx.py(b, scripts.EXISTS, {"paths": paths, "names": [name]})
    in_layers = [str(d / p.lstrip("/")) for d in ctx.layer_dirs for p in paths]
    in_layers = [p for p in in_layers if Path(p).exists()]
    breaches = []
    if any(seen_b["exists"].values()) or seen_b["found_by_name"]:
        breaches.append(f"B sees A's files: {seen_b}")
    if in_layers:
        breaches.append(f"A's files reached the baseline layers: {in_layers}")
    out = verdict(
        breaches, f"{len(paths)} files written in A: B sees none, no baseline layer has one"
    )
    out.evidence = {"written_in_a": wrote["written"], "b_view": seen_b, "layer_hits": in_layers}
    return out


@probe("cross-sandbox-processes", "conformance")
async def cross_processes(ctx: AuditContext) -> Outcome:
    """A's processes cannot be seen or signalled from B."""
    a, b = await ctx.shared()
    secs = f"3000.{secrets.randbelow(10**6):06d}"
    started = await ctx.py(a, scripts.START_MARKER, {"seconds": secs})
    pids = started["marker_pids"]
    if not pids:
        raise ProbeError(f"could not start a marker process in A: {started}")
    # B looks for it by command line, and sends SIGKILL to the same pid numbers.
    seen_b = await ctx.py(b, scripts.SCAN_PROCS, {"tokens": [secs], "kill": pids})
    after = await ctx.py(a, scripts.SCAN_PROCS, {"tokens": [secs]})
    breaches = []
    if seen_b["cmdline_hits"]:
        breaches.append(f"B sees A's marker process (pids {seen_b['cmdline_hits']})")
    if not after["cmdline_hits"]:
        breaches.append("A's marker process died after B's kill attempts")
    out = verdict(
        breaches,
        f"A's marker (pids {pids} in A) invisible in B's /proc ({len(seen_b['processes'])} "
        "processes listed) and alive after B sent SIGKILL to those pid numbers",
    )
    out.evidence = {
        "a_marker_pids": pids,
        "b_processes": seen_b["processes"],
        "b_kill_results": seen_b["kills"],
        "a_marker_alive_after": after["cmdline_hits"],
    }
    return out


@probe("cross-sandbox-env-secrets", "conformance")
async def cross_env(ctx: AuditContext) -> Outcome:
    """A's env vars and secrets are absent from B; secrets are masked and never on disk."""
    a, b = await ctx.shared()
    toks = [ctx.a_env_token, ctx.a_secret_token]
    own = await ctx.py(a, scripts.SCAN_PROCS, {"tokens": toks})
    echo = await a.exec(["sh", "-c", "echo $RBX_AUDIT_SECRET_A"])
    # A process of A that holds the env var and the secret stays alive while B looks.
    secs = f"3001.{secrets.randbelow(10**6):06d}"
    holder = await ctx.py(a, scripts.START_MARKER, {"seconds": secs})
    if not holder["marker_pids"]:
        raise ProbeError(f"could not start a process holding A's secret in A: {holder}")
    in_b = await ctx.py(b, scripts.SCAN_PROCS, {"tokens": toks})
    await ctx.py(a, scripts.SCAN_PROCS, {"tokens": [], "kill": holder["marker_pids"]})
    b_env = await b.exec(["env"])
    # Secrets must not be written anywhere in the home (state, logs, tmp).
    grep = subprocess.run(
        ["grep", "-rlsF", ctx.a_secret_token, str(ctx.home.sandboxes), str(ctx.home.tmp)],
        capture_output=True,
        text=True,
        check=False,
    )
    if ctx.a_env_token not in "".join(own["self_env_has"]):
        raise ProbeError(f"A's env var is missing in A itself: {own['self_env_has']}")
    breaches = []
    if in_b["self_env_has"] or any(t in b_env.stdout for t in toks):
        breaches.append("B's environment holds A's env/secret")
    if in_b["environ_hits"] or in_b["cmdline_hits"]:
        breaches.append(f"B reads A's env/secret in /proc (pids {in_b['environ_hits']})")
    if ctx.a_secret_token in echo.stdout:
        breaches.append("secret value appears unmasked in captured output")
    if grep.stdout.strip():
        breaches.append(f"secret value written to disk: {grep.stdout.split()}")
    out = verdict(
        breaches,
        "B's env and /proc hold neither A's env var nor A's secret; the secret is masked in "
        "output and found in no file of the home",
    )
    out.evidence = {
        "a_has_own_env": own["self_env_has"],
        "a_echo_secret_stdout": echo.stdout.strip(),
        "b_environ_readable": in_b["environ_readable"],
        "b_hits": {"env": in_b["self_env_has"], "proc": in_b["environ_hits"]},
        "files_with_secret": grep.stdout.split(),
    }
    return out


@probe("host-files-invisible", "conformance")
async def host_files(ctx: AuditContext) -> Outcome:
    """No host file outside the baseline is visible inside."""
    a, _ = await ctx.shared()
    host_paths = [
        str(ctx.canary_file),
        str(ctx.canary_dir),
        str(ctx.home.root),
        str(ctx.home.sandboxes),
        str(ctx.layer_dirs[0]) if ctx.layer_dirs else "/nonexistent",
    ]
    extra = [p for p in ("/work", "/var/lib/rollbox", "/run/netns") if Path(p).exists()]
    host_paths += extra
    seen = await ctx.py(a, scripts.EXISTS, {"paths": host_paths, "names": [ctx.canary_file.name]})
    # Only directories that exist (a missing one is grep's exit 2 too); devices, fifos
    # and sockets skipped. Exit 0: found; 1: not found; anything else: grep failed.
    dirs = "/etc /root /tmp /var /opt /home /srv"
    grep = await a.exec(
        [
            "sh",
            "-c",
            f'set --; for d in {dirs}; do [ -d "$d" ] && set -- "$@" "$d"; done; '
            f'exec grep -rlF -D skip -e {ctx.canary_token} -- "$@"',
        ]
    )
    if grep.exit_code not in (0, 1):
        raise ProbeError(
            f"grep for the host canary failed inside (exit {grep.exit_code}): "
            f"{grep.stderr.strip()[-300:]}"
        )
    visible = [p for p, e in seen["exists"].items() if e]
    breaches = []
    if visible:
        breaches.append(f"host paths visible inside: {visible}")
    if seen["found_by_name"] or grep.exit_code == 0:
        breaches.append(f"host canary found inside: {seen['found_by_name'] or grep.stdout}")
    out = verdict(breaches, f"none of {len(host_paths)} host-only paths is visible inside")
    out.evidence = {
        "checked": seen["exists"],
        "canary_by_name": seen["found_by_name"],
        "grep_exit": grep.exit_code,
        "grep_hits": grep.stdout.split(),
    }
    return out


def _sha(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _in_layers(ctx: AuditContext, rel: str) -> Path | None:
    for d in reversed(ctx.layer_dirs):  # top first
        p = d / rel.lstrip("/")
        if p.exists() or p.is_symlink():
            return p
    return None


@probe("baseline-immutable", "conformance")
async def baseline_writes(ctx: AuditContext) -> Outcome:
    """Writes, appends and deletes inside never reach the baseline's layers."""
    a, _ = await ctx.shared()
    targets = ["/etc/os-release", "/etc/passwd", "/usr/bin/env"]
    host_before: dict[str, Any] = {}
    for t in targets:
        p = _in_layers(ctx, t)
        if p is None:
            raise ProbeError(f"{t} not found in the baseline layers")
        host_before[t] = (str(p), _sha(p))
    new = f"/etc/{token('new')}"
    mut = await ctx.py(
        a,
        scripts.MUTATE_BASELINE,
        {"append": ["/etc/os-release", "/etc/passwd"], "delete": ["/usr/bin/env"], "new": new},
    )
    failed = {k: v for k, v in mut["result"].items() if v not in ("appended", "deleted", "created")}
    if failed:  # nothing was changed inside, so nothing could reach the layers
        raise ProbeError(f"the mutations inside A failed: {failed}")
    host_after = {t: _sha(Path(p)) for t, (p, _h) in host_before.items()}
    changed = [t for t in targets if host_after[t] != host_before[t][1]]
    new_in_layers = _in_layers(ctx, new)
    # A sandbox made now must see the original content.
    fresh = await ctx.sandbox()
    fresh_view = await ctx.py(fresh, scripts.HASH_FILES, {"paths": targets})
    differs = [t for t in targets if fresh_view["sha256"][t] != host_before[t][1]]
    breaches = []
    if changed:
        breaches.append(f"baseline layer files changed: {changed}")
    if new_in_layers is not None:
        breaches.append(f"new file reached a layer: {new_in_layers}")
    if differs:
        breaches.append(f"a fresh sandbox sees modified baseline files: {differs}")
    out = verdict(
        breaches,
        "after appends/deletes/creates in A, layer files hash the same and a fresh sandbox "
        "sees the original content",
    )
    out.evidence = {
        "mutations_in_a": mut["result"],
        "layer_sha256": host_before,
        "fresh": fresh_view,
    }
    return out


@probe("pids-limit", "conformance")
async def pids_limit(ctx: AuditContext) -> Outcome:
    """A fork bomb is held by the pids limit, inside only."""
    limit = 64
    sbx = await ctx.sandbox(limits=Limits(pids=limit, memory_mb=256, disk_mb=64))
    # 4x the limit is a breach already; more would only be the memory limit's business
    res = await ctx.py(sbx, scripts.FORK_BOMB, {"max": 4 * limit}, timeout=90)
    if res["error"] not in (None, "EAGAIN"):
        raise ProbeError(f"forks failed with {res['error']}, not the pids limit's EAGAIN")
    alive = await sbx.exec(["true"])
    breaches = []
    if res["error"] is None or res["forked"] >= limit:
        breaches.append(f"forked {res['forked']} processes with pids limit {limit}")
    if not ctx.canary_alive():
        breaches.append("host canary process died")
    if alive.exit_code != 0:
        breaches.append("sandbox unusable after the fork bomb")
    out = verdict(
        breaches, f"fork bomb stopped at {res['forked']} forks ({res['error']}) with limit {limit}"
    )
    out.evidence = {"fork_bomb": res, "limit": limit, "exec_after": alive.exit_code}
    return out


@probe("memory-limit", "conformance")
async def memory_limit(ctx: AuditContext) -> Outcome:
    """A memory hog is OOM-killed inside; the sandbox and the host carry on."""
    sbx = await ctx.sandbox(limits=Limits(memory_mb=64, pids=64, disk_mb=64))
    hog: ExecResult | None = None
    whole_sandbox_killed = ""
    alive_code: int | None = None
    try:
        hog = await sbx.exec(["python3", "-c", "b = b'x' * (512 << 20); print(len(b))"], timeout=60)
        alive_code = (await sbx.exec(["true"])).exit_code
    except (SandboxCrashedError, SandboxStateError) as exc:
        # gVisor: the sandbox's kernel lives inside the limit, so the whole sandbox goes.
        whole_sandbox_killed = exc.one_line()
    if whole_sandbox_killed:
        a, _ = await ctx.shared()
        a_ok = (await a.exec(["true"])).exit_code == 0
        breaches = []
        if hog is not None and hog.exit_code == 0:
            breaches.append("512 MiB allocated under a 64 MiB limit")
        if not ctx.canary_alive():
            breaches.append("host canary process died")
        if not a_ok:
            breaches.append("another sandbox stopped answering")
        out = verdict(
            breaches,
            "512 MiB hog under 64 MiB: the whole sandbox was killed by its memory limit; "
            "other sandboxes and the host unharmed",
        )
        out.evidence = {
            "sandbox_error": whole_sandbox_killed,
            "hog_exit": hog.exit_code if hog else None,
            "hog_oom_killed": hog.oom_killed if hog else None,
            "other_sandbox_ok": a_ok,
        }
        return out
    assert hog is not None
    killed = hog.oom_killed or hog.exit_code in (137, -9)
    if hog.exit_code != 0 and not killed:
        # 127 (no python3), a MemoryError (an rlimit, not the memory limit), a crash:
        # the limit was not what stopped it, so this run proves nothing.
        raise ProbeError(
            f"the hog exited {hog.exit_code} without being killed: {hog.stderr.strip()[-200:]}"
        )
    breaches = []
    if hog.exit_code == 0:
        breaches.append("512 MiB allocated under a 64 MiB limit")
    if not ctx.canary_alive():
        breaches.append("host canary process died")
    if alive_code != 0:
        breaches.append("sandbox unusable after the OOM kill")
    out = verdict(
        breaches,
        f"512 MiB hog under 64 MiB: exit {hog.exit_code}, oom_killed={hog.oom_killed}",
    )
    out.evidence = {
        "exit_code": hog.exit_code,
        "oom_killed": hog.oom_killed,
        "reported_as_oom": killed,
        "stderr_tail": hog.stderr[-200:],
    }
    return out


@probe("disk-limit", "conformance")
async def disk_limit(ctx: AuditContext) -> Outcome:
    """A disk filler hits the disk limit."""
    limit = 32
    sbx = await ctx.sandbox(limits=Limits(disk_mb=limit, memory_mb=256, pids=64))
    res = await ctx.py(sbx, scripts.DISK_FILL, {"path": "/var/rbx-fill", "mb": 128}, timeout=90)
    alive = await sbx.exec(["true"])
    if res["error"] not in (None, "ENOSPC", "EDQUOT", "EFBIG"):
        raise ProbeError(f"the disk filler failed with {res['error']}, not a full disk")
    breaches = []
    if res["error"] is None or res["written_mb_attempted"] > limit * 1.1:
        breaches.append(f"wrote {res['written_mb_attempted']} MiB with a {limit} MiB limit")
    if alive.exit_code != 0:
        breaches.append("sandbox unusable after filling its disk")
    out = verdict(
        breaches,
        f"writing 128 MiB stopped after {res['written_mb_attempted']} MiB ({res['error']})",
    )
    out.evidence = {"fill": res, "limit_mb": limit}
    return out


TIMEOUT_S = 4.0
"""The timed exec's timeout: long enough to see its sleepers start (TCG guests are slow)."""


@probe("timeout-no-survivors", "conformance")
async def timeout_survivors(ctx: AuditContext) -> Outcome:
    """A timed-out exec leaves no survivor, setsid/nohup daemons included."""
    a, _ = await ctx.shared()
    secs = [f"1000.{secrets.randbelow(10**6):06d}" for _ in range(3)]
    cmd = f"setsid sleep {secs[0]} & nohup sleep {secs[1]} >/dev/null 2>&1 & sleep {secs[2]}"
    timed_out = False
    run = asyncio.create_task(a.exec(["sh", "-c", cmd], timeout=TIMEOUT_S))
    # precondition: all three sleepers run before the timeout (else no survivor proves
    # nothing, e.g. no setsid in the baseline)
    started: list[int] = []
    while not run.done() and len(started) < 3:
        started = (await ctx.py(a, scripts.SCAN_PROCS, {"tokens": secs}))["cmdline_hits"]
    try:
        await run
    except ExecTimeoutError:
        timed_out = True
    if len(started) < 3:
        raise ProbeError(f"only {len(started)} of the 3 sleepers were seen running")
    inside = await ctx.py(a, scripts.SCAN_PROCS, {"tokens": secs})
    host = subprocess.run(
        ["pgrep", "-af", "sleep 1000."], capture_output=True, text=True, check=False
    )
    host_hits = [ln for ln in host.stdout.splitlines() if any(s in ln for s in secs)]
    breaches = []
    if not timed_out:
        breaches.append("the exec did not time out")
    if inside["cmdline_hits"]:
        breaches.append(f"survivors inside: pids {inside['cmdline_hits']}")
    if host_hits:
        breaches.append(f"survivors on the host: {host_hits}")
    out = verdict(breaches, "ExecTimeoutError raised; no sleeper left inside or on the host")
    out.evidence = {
        "timed_out": timed_out,
        "inside_hits": inside["cmdline_hits"],
        "host_hits": host_hits,
    }
    return out
