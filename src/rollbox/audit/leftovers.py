"""What an audit killed mid-run (SIGKILL, a lost terminal) leaves, and its removal.

An audit's own host resources — the canary directory under ``/var/tmp``, the canary
``sleep``, its network namespace with the veth and server, scratch directories — carry
the home's tag. Each canary directory holds ``owner.json`` naming the audit process (pid
and start time, so a reused pid does not count as alive) and the resources it made.
:func:`sweep` removes those of audits that are gone; ``rollbox cleanup`` and every new
audit of the home call it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from rollbox.config import Home

CANARY_ROOT = Path("/var/tmp")
OWNER = "owner.json"
SCRATCH_STALE_S = 3600.0
"""Scratch directories (race downloads, a store copy) older than this belong to no live
audit: one probe lasts minutes at most."""


def start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str | None) -> bool:
    """Process ``pid`` exists and started at ``started`` (the same process)."""
    return started is not None and start_time(pid) == started


def write_owner(canary_dir: Path, **resources: Any) -> None:
    """Record this process and ``resources`` (canary pid, netns, veth) in ``canary_dir``."""
    pid = os.getpid()
    doc = {"pid": pid, "started": start_time(pid), **resources}
    (canary_dir / OWNER).write_text(json.dumps(doc))


def canary_dirs(home: Home) -> list[Path]:
    """This home's audit canary directories."""
    return sorted(CANARY_ROOT.glob(f"rbx-audit-{home.tag}-*"))


def sweep(home: Home, dry_run: bool = False) -> list[str]:
    """Remove what audits of ``home`` that are no longer running left; one line each."""
    lines: list[str] = []
    for d in canary_dirs(home):
        try:
            doc = json.loads((d / OWNER).read_text())
        except (OSError, ValueError):
            # no owner yet: an audit between mkdir and writing it, or one killed there
            with contextlib.suppress(OSError):
                if time.time() - d.stat().st_mtime < SCRATCH_STALE_S:
                    continue
            doc = {}
        if doc and alive(int(doc.get("pid", 0)), doc.get("started")):
            continue
        if not dry_run:
            _remove(doc, d)
        what = ", ".join(f"{k} {doc[k]}" for k in ("netns", "canary_pid") if doc.get(k))
        lines.append(f"audit leftovers {d}" + (f" ({what})" if what else ""))
    now = time.time()
    for scratch in sorted(Path("/tmp").glob(f"rbx-audit-{home.tag}-*")):
        with contextlib.suppress(OSError):
            if now - scratch.stat().st_mtime < SCRATCH_STALE_S:
                continue
            if not dry_run:
                shutil.rmtree(scratch, ignore_errors=True)
            lines.append(f"audit scratch {scratch}")
    return lines


def _remove(doc: dict[str, Any], d: Path) -> None:
    pid, started = int(doc.get("canary_pid") or 0), doc.get("canary_started")
    if pid and alive(pid, started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    netns = doc.get("netns")
    if netns:
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        for p in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(p), signal.SIGKILL)
        if doc.get("host_if"):
            subprocess.run(["ip", "link", "del", doc["host_if"]], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)
