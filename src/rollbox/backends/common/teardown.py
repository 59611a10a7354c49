"""Fast teardown of a namespace sandbox (the generic, slower paths are the fallback).

Killing the agent -- PID 1 of the sandbox's pid namespace -- makes the kernel kill every
other process of the namespace, so no freezer round trip is needed; the outer ``bwrap``
is killed alongside (on cgroup v2 one ``cgroup.kill`` does all of it). Then the known
cgroup directories are removed deepest first and the two mounts are unmounted directly,
without scanning the host's mount table.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from pathlib import Path

from rollbox.backends.common.cgroups import CGROUP_ROOT, Cgroup
from rollbox.backends.common.rootfs import Rootfs, sys_umount

KILL_WAIT_S = 2.0


def _procs(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def kill_sandbox(cg: Cgroup) -> bool:
    """SIGKILL every process of the sandbox and wait until none is left in its groups.

    Returns:
        False when processes are still there after ``KILL_WAIT_S`` (caller falls back).
    """
    pids_dir = cg.paths["pids"]
    if not pids_dir.is_dir():
        return True
    if cg.version == 2:
        return _kill_v2(pids_dir)
    # Top-level tasks are bwrap, the agent (ns PID 1) and exec sessions; exec children
    # live below box/ and die with the pid namespace.
    for pid in _procs(pids_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # A paused sandbox's tasks cannot die while frozen: thaw (the kill is already pending).
    state = cg.paths["freezer"] / "freezer.state"
    try:
        if state.read_text().strip() != "THAWED":
            state.write_text("THAWED")
    except FileNotFoundError:
        pass
    deadline = time.monotonic() + KILL_WAIT_S
    delay = 0.0002
    while True:
        left = [p for d, _s, _f in os.walk(pids_dir) for p in _procs(Path(d))]
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        # Anything that escaped the namespace kill (should not happen) gets killed too.
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _kill_v2(top: Path) -> bool:
    """``cgroup.kill`` the sandbox's whole subtree (frozen tasks die too on v2) and wait
    for ``populated 0``."""
    try:
        (top / "cgroup.kill").write_text("1")
    except FileNotFoundError:
        return False  # kernel < 5.14: the generic freeze + SIGKILL loop
    deadline = time.monotonic() + KILL_WAIT_S
    delay = 0.0002
    while "populated 1" in _events(top):
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    return True


def _events(top: Path) -> str:
    try:
        return (top / "cgroup.events").read_text()
    except FileNotFoundError:
        return ""


def remove_cgroup_dirs(cg: Cgroup) -> bool:
    """rmdir the sandbox's group in every controller, children first.

    Returns:
        False when a directory could not be removed (caller falls back).
    """
    ok = True
    tops = {p for p in cg.paths.values()}
    # Every mounted v1 hierarchy: OCI runtimes (gVisor) also make the group in cpuset,
    # devices and named hierarchies. (On v2 the one directory is all.)
    for hierarchy in CGROUP_ROOT.iterdir() if cg.version == 1 else ():
        if hierarchy.name != "unified" and not hierarchy.is_symlink():
            tops.add(hierarchy / cg.name)
    for top in sorted(tops):
        if not top.is_dir():
            continue
        dirs = [Path(d) for d, _s, _f in os.walk(top)]
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            for attempt in range(20):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 19:
                        ok = False
                        break
                    time.sleep(0.001)
        try:
            os.rmdir(top.parent)  # the per-home parent, once empty
        except OSError:
            pass
    return ok


def remove_rootfs(sandbox_dir: Path) -> bool:
    """Unmount overlay then tmpfs and delete the directory.

    Returns:
        False when something stayed mounted (caller falls back; nothing deleted then).
    """
    fs = Rootfs.open(sandbox_dir)
    try:
        sys_umount(fs.root)
        sys_umount(fs.upperfs)
    except OSError:
        return False
    # Refuse to delete through a mount that is still there (never the baseline layers).
    if os.path.ismount(fs.root) or os.path.ismount(fs.upperfs):
        return False
    shutil.rmtree(sandbox_dir, ignore_errors=True)
    return not sandbox_dir.exists()


def why_not_removed(path: Path) -> str | None:
    """Try once more to delete ``path`` (a directory an ``ignore_errors`` delete left).

    Returns:
        None when it is gone now, else a line naming it and the first error.
    """
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} could not be deleted ({exc.filename}: {exc.strerror or exc})"
    return None
