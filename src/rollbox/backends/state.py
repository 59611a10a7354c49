"""Sandbox directories and their ``state.json`` (usable by every backend).

``$ROLLBOX_HOME/sandboxes/<id>/state.json`` holds a :class:`~rollbox.models.SandboxInfo`;
it is replaced atomically. Ownership: a sandbox created through the library records its
owner's pid and process start time in ``extra``; when that process is gone the sandbox
is an orphan that ``rollbox cleanup`` removes. A sandbox created by the CLI has no owner
(it lives until ``rm`` or its TTL).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import SandboxNotFoundError
from rollbox.models import SandboxInfo, utcnow


def sandbox_dir(home: Home, sandbox_id: str) -> Path:
    """The directory of sandbox ``sandbox_id``."""
    return home.sandboxes / sandbox_id


def write_state(home: Home, info: SandboxInfo) -> None:
    """Write ``info`` to its ``state.json`` atomically."""
    path = sandbox_dir(home, info.id) / "state.json"
    tmp = path.with_name(f".state.{os.getpid()}.tmp")
    tmp.write_text(info.model_dump_json(indent=1))
    os.replace(tmp, path)


def read_state(home: Home, sandbox_id: str) -> SandboxInfo:
    """The stored state of ``sandbox_id``.

    Raises:
        SandboxNotFoundError: no such sandbox (or an unreadable record).
    """
    path = sandbox_dir(home, sandbox_id) / "state.json"
    try:
        return SandboxInfo.model_validate(json.loads(path.read_text()))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        raise SandboxNotFoundError(
            f"no sandbox {sandbox_id!r} in {home.root}", hint="see 'rollbox sandbox ls'"
        ) from None


def list_states(home: Home, backend: str | None = None) -> list[SandboxInfo]:
    """Every readable sandbox record in ``home`` (of ``backend`` if given), oldest first."""
    out = []
    try:
        names = sorted(os.listdir(home.sandboxes))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            info = read_state(home, name)
        except SandboxNotFoundError:
            continue
        if backend is None or info.backend == backend:
            out.append(info)
    return out


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``None`` if it does not exist);
    with the pid it identifies a process even after pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The comm field may contain spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


def process_alive(pid: int | None, start: int | None) -> bool:
    """True when ``pid`` exists and (if given) has start time ``start``."""
    if pid is None:
        return False
    now = process_start_time(pid)
    if now is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
    except (FileNotFoundError, IndexError):
        return False
    return start is None or now == start


def owner_fields(detached: bool) -> tuple[int | None, dict[str, object]]:
    """``owner_pid`` and the ``extra`` entries recording the calling process as owner
    (nothing when ``detached``)."""
    if detached:
        return None, {"detached": True}
    pid = os.getpid()
    return pid, {"owner_start": process_start_time(pid)}


def owner_gone(info: SandboxInfo) -> bool:
    """True when the sandbox had an owner process and it has died."""
    if info.extra.get("detached") or info.owner_pid is None:
        return False
    start = info.extra.get("owner_start")
    return not process_alive(info.owner_pid, start if isinstance(start, int) else None)


def expired(info: SandboxInfo, now: datetime | None = None) -> bool:
    """True when the sandbox's TTL has passed."""
    return info.expires_at is not None and (now or utcnow()) >= info.expires_at
