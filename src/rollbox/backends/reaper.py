"""TTL reaper: one background process per home destroys sandboxes past their TTL, even
after the process that created them died.

:func:`ensure_reaper` (called after creating a sandbox with a TTL) starts
``python -m rollbox.backends.reaper HOME`` detached, unless one already holds the home's
``locks/reaper.lock``. The reaper sleeps until the next expiry, destroys what expired and
exits once no sandbox of the home has a TTL; before exiting it drops the lock and looks
once more, so a sandbox created meanwhile is never left without a reaper.
"""

from __future__ import annotations

import contextlib
import fcntl
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


def reap_once(home: Home) -> list[str]:
    """Destroy every expired sandbox of ``home`` now; returns their ids."""
    from rollbox.backends.registry import get_backend

    done = []
    for info in list_states(home):
        if info.state == "destroyed" or not expired(info):
            continue
        with contextlib.suppress(RollboxError, OSError):
            be = get_backend(info.backend, home)
            destroy = getattr(be, "destroy_by_id", None)
            if destroy is not None:
                destroy(info.id)
            else:
                import asyncio

                asyncio.run(_destroy(be, info.id))
            done.append(info.id)
    return done


async def _destroy(be: object, sandbox_id: str) -> None:
    from rollbox.backends.base import Backend

    assert isinstance(be, Backend)
    handle = await be.attach(sandbox_id)
    await handle.destroy()


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
    while True:
        reap_once(home)
        pending = _with_ttl(home)
        if not pending:
            os.close(fd)  # release, then look once more (see module docstring)
            if not _with_ttl(home):
                return
            fd = _try_lock(home)
            if fd is None:
                return
            continue
        time.sleep(min(POLL_MAX_S, max(0.05, min(p[2] for p in pending))))


if __name__ == "__main__":
    run(Home(Path(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else None)
