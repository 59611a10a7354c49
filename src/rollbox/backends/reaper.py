"""TTL reaper: one background process per home destroys sandboxes past their TTL, even
after the process that created them died.

:func:`ensure_reaper` (called after creating a sandbox with a TTL) starts
``python -m rollbox.backends.reaper HOME`` detached, unless one already holds the home's
``locks/reaper.lock``. The reaper sleeps until the next expiry, destroys what expired and
exits once no sandbox of the home has a TTL; before exiting it drops the lock and looks
once more, so a sandbox created meanwhile is never left without a reaper.

A destroy that fails is never silent: one JSON line per failure goes to
``$ROLLBOX_HOME/reaper-failures.jsonl`` (shown by ``rollbox cleanup``). The reaper retries
it with a growing pause and gives up after :data:`MAX_TRIES` attempts, leaving it to
``rollbox cleanup``.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rollbox.backends.state import expired, list_states
from rollbox.config import Home
from rollbox.errors import RollboxError
from rollbox.models import utcnow

POLL_MAX_S = 1.0
MAX_TRIES = 5
"""Failed destroys of one sandbox before the reaper leaves it to ``rollbox cleanup``."""
FAILURES_NAME = "reaper-failures.jsonl"


def failures_path(home: Home) -> Path:
    """Where the reaper logs what it could not remove."""
    return home.root / FAILURES_NAME


def log_failure(home: Home, sandbox_id: str, error: str, attempt: int) -> None:
    """Append one failure line (appends of one short line are atomic)."""
    line = {"at": utcnow().isoformat(), "sandbox": sandbox_id, "error": error, "try": attempt}
    with open(failures_path(home), "a") as f:
        f.write(json.dumps(line) + "\n")


def read_failures(home: Home) -> list[dict[str, object]]:
    """The logged failures, oldest first (unparsable lines reported as such)."""
    try:
        text = failures_path(home).read_text()
    except FileNotFoundError:
        return []
    out: list[dict[str, object]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"error": f"unreadable log line: {line[:200]}"})
    return out


def clear_failures(home: Home) -> None:
    """Move the shown failures to ``reaper-failures.seen.jsonl`` (kept, no longer shown)."""
    path = failures_path(home)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    with open(path.with_suffix(".seen.jsonl"), "a") as f:
        f.write(text)
    # only what was shown: lines appended meanwhile stay
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        rest = f.read()[len(text) :]
        f.seek(0)
        f.write(rest)
        f.truncate()


def _lock_path(home: Home) -> Path:
    return home.locks / "reaper.lock"


def _try_lock(home: Home) -> int | None:
    home.locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(home), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def reaper_running(home: Home) -> bool:
    """True when a reaper holds this home's lock."""
    fd = _try_lock(home)
    if fd is None:
        return True
    os.close(fd)
    return False


def ensure_reaper(home: Home) -> None:
    """Start the home's reaper process unless one is running.

    The lock is taken here and handed to the child (an inherited ``flock`` stays held), so
    concurrent creates cannot each spawn a reaper while the first one is still starting up
    (each spawn is a Python start-up that competes with the sandboxes for the CPU).
    """
    fd = _try_lock(home)
    if fd is None:
        return
    try:
        subprocess.Popen(
            [sys.executable, "-m", "rollbox.backends.reaper", str(home.root), str(fd)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)  # the child's copy keeps the lock


def _with_ttl(home: Home) -> list[tuple[str, str, float]]:
    """(id, backend, seconds until expiry) of live sandboxes with a TTL."""
    now = utcnow()
    return [
        (i.id, i.backend, (i.expires_at - now).total_seconds())
        for i in list_states(home)
        if i.expires_at is not None and i.state != "destroyed"
    ]


class _Tries:
    """Failed destroys per sandbox: how many, and when the next try is due."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.due: dict[str, float] = {}

    def skip(self, sandbox_id: str) -> bool:
        if self.count.get(sandbox_id, 0) >= MAX_TRIES:
            return True  # given up: left to `rollbox cleanup`
        return time.monotonic() < self.due.get(sandbox_id, 0.0)

    def failed(self, sandbox_id: str) -> int:
        n = self.count[sandbox_id] = self.count.get(sandbox_id, 0) + 1
        self.due[sandbox_id] = time.monotonic() + min(60.0, 2.0**n)
        return n

    def given_up(self) -> set[str]:
        return {s for s, n in self.count.items() if n >= MAX_TRIES}


def reap_once(home: Home, tries: _Tries | None = None) -> list[str]:
    """Destroy every expired sandbox of ``home`` now; returns their ids. A failure is logged
    (see :func:`log_failure`), never swallowed."""
    from rollbox.backends.registry import get_backend

    tries = tries or _Tries()
    done = []
    for info in list_states(home):
        if info.state == "destroyed" or not expired(info) or tries.skip(info.id):
            continue
        try:
            get_backend(info.backend, home).destroy_by_id(info.id)
        except (RollboxError, OSError) as exc:
            n = tries.failed(info.id)
            text = str(exc).replace("\n", " ")
            if n >= MAX_TRIES:
                text += f" (gave up after {n} tries: run `rollbox cleanup`)"
            try:
                log_failure(home, info.id, f"{type(exc).__name__}: {text}", n)
            except OSError:
                pass  # the home itself is unwritable: nothing left to tell
            continue
        done.append(info.id)
    return done


def run(home: Home, lock_fd: int | None = None) -> None:
    """The reaper loop (returns when no sandbox of ``home`` has a TTL).

    Args:
        home: the home whose sandboxes are reaped.
        lock_fd: the home's reaper lock, already held (inherited from :func:`ensure_reaper`);
            ``None`` takes it here (returns at once when another reaper holds it).
    """
    fd = _try_lock(home) if lock_fd is None else lock_fd
    if fd is None:
        return
    tries = _Tries()
    while True:
        reap_once(home, tries)
        pending = [p for p in _with_ttl(home) if p[0] not in tries.given_up()]
        if not pending:
            os.close(fd)  # release, then look once more (see module docstring)
            if not [p for p in _with_ttl(home) if p[0] not in tries.given_up()]:
                return
            fd = _try_lock(home)
            if fd is None:
                return
            continue
        now = time.monotonic()
        # a failed sandbox stays expired: wait for its next try, not for its expiry
        waits = [max(p[2], tries.due.get(p[0], now) - now) for p in pending]
        time.sleep(min(POLL_MAX_S, max(0.05, min(waits))))


if __name__ == "__main__":
    run(Home(Path(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else None)
