"""Advisory ``flock`` locks under ``$ROLLBOX_HOME/locks`` and lock-guarded staging dirs."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

STAGE_PREFIX = "bl-"


@contextlib.contextmanager
def flock(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an exclusive (or shared) flock on ``path`` (created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def lock_is_held(path: Path) -> bool:
    """True when some process holds a flock on ``path`` right now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def staging_dir(tmp: Path, label: str = "") -> Iterator[Path]:
    """A fresh directory in ``tmp`` held under flock while in use, removed afterwards.

    A process killed while using it leaves the directory behind, but unlocked, so
    :func:`remove_stale_staging` can tell it from one in use.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{STAGE_PREFIX}{label}{'-' if label else ''}{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def remove_stale_staging(tmp: Path) -> list[Path]:
    """Remove staging dirs in ``tmp`` whose owner died (their flock is free); return them."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(tmp))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.name.startswith(STAGE_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        finally:
            os.close(fd)
    return removed
