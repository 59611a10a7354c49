"""Overlayfs root filesystems for sandboxes, with a size-limited upper dir.

Layout in a sandbox directory::

    <sandbox_dir>/upperfs/          tmpfs of size=disk_mb (plain dir when disk is unlimited)
    <sandbox_dir>/upperfs/upper/    overlay upperdir: everything the sandbox wrote
    <sandbox_dir>/upperfs/work/     overlay workdir
    <sandbox_dir>/rootfs/           the overlay mount point (the sandbox's /)
    <sandbox_dir>/l/<i>             short symlinks to the lower dirs (mount option limit)

Mounts are made with the ``mount(2)`` syscall directly (a few ms saved per sandbox
against spawning ``mount``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendError, LimitsError

MNT_DETACH = 2
_OPTION_LIMIT = 3500  # the kernel takes one page of mount options; stay well below

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


_CWD_LOCK = threading.Lock()


def sys_mount(source: str, target: Path, fstype: str, options: str, flags: int = 0) -> None:
    """``mount(2)``; raises ``OSError`` with the errno on failure."""
    rc = _libc.mount(
        source.encode(), str(target).encode(), fstype.encode(), flags, options.encode()
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def sys_umount(target: Path, flags: int = 0) -> None:
    """``umount2(2)``; ``EINVAL``/``ENOENT`` (not mounted) are ignored."""
    rc = _libc.umount2(str(target).encode(), flags)
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def mounts_under(prefix: Path) -> list[Path]:
    """Mount points at or below ``prefix`` (deepest first), from /proc/self/mountinfo."""
    pre = str(prefix).rstrip("/")
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split(" ")[4].replace("\\040", " ")
            if mp == pre or mp.startswith(pre + "/"):
                out.append(Path(mp))
    return sorted(set(out), key=lambda p: len(p.parts), reverse=True)


def is_mountpoint(path: Path) -> bool:
    """True when ``path`` is itself a mount point."""
    return path in mounts_under(path)


def unmount_tree(path: Path) -> list[Path]:
    """Unmount everything at or below ``path`` (deepest first, stacked mounts too, lazily
    if busy)."""
    done: list[Path] = []
    for _ in range(64):  # bounded: each round removes at least one mount or raises
        found = mounts_under(path)
        if not found:
            break
        for mp in found:
            _umount_one(mp)
            done.append(mp)
    return done


def _umount_one(mp: Path) -> None:
    try:
        sys_umount(mp)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        sys_umount(mp, MNT_DETACH)  # last resort: detach now, free when unused


@dataclass
class Rootfs:
    """A sandbox's overlay root: read-only baseline layers plus a private upper dir."""

    root: Path
    """The overlay mount point (``<sandbox_dir>/rootfs``)."""
    upper: Path
    """The overlay upper dir (``<sandbox_dir>/upperfs/upper``)."""

    @property
    def sandbox_dir(self) -> Path:
        """The sandbox directory holding this rootfs."""
        return self.root.parent

    @property
    def upperfs(self) -> Path:
        """The (tmpfs) directory holding upper and work."""
        return self.upper.parent

    @property
    def work(self) -> Path:
        """The overlay work dir."""
        return self.upperfs / "work"

    @classmethod
    def open(cls, sandbox_dir: Path) -> Rootfs:
        """The rootfs of an existing sandbox directory (mounted or not)."""
        return cls(root=sandbox_dir / "rootfs", upper=sandbox_dir / "upperfs" / "upper")

    @classmethod
    def mount(
        cls,
        sandbox_dir: Path,
        lower_dirs: list[Path],
        disk_mb: int | None,
        upper_from: Path | None = None,
    ) -> Rootfs:
        """Mount an overlay of ``lower_dirs`` (bottom first) with a fresh upper.

        Args:
            sandbox_dir: the sandbox's directory (created if missing).
            lower_dirs: read-only layer directories, bottom layer first.
            disk_mb: size of the tmpfs holding the upper dir; ``None`` for no limit.
            upper_from: an upper dir whose contents (whiteouts and xattrs included) seed
                the new upper -- how ``fork()`` copies a sandbox's changes.

        Raises:
            LimitsError: ``upper_from`` does not fit in ``disk_mb``.
            BackendError: a mount failed (nothing is left mounted).
        """
        if not lower_dirs:
            raise BackendError("a rootfs needs at least one lower layer")
        for d in lower_dirs:
            if not d.is_dir():
                raise BackendError(f"layer directory {d} is missing", hint="run 'rollbox fsck'")
        fs = cls.open(sandbox_dir)
        sandbox_dir.mkdir(parents=True, exist_ok=True)
        try:
            fs.upperfs.mkdir(exist_ok=True)
            if disk_mb is not None:
                sys_mount("rollbox-upper", fs.upperfs, "tmpfs", f"size={disk_mb}m,mode=0700")
            fs.upper.mkdir(exist_ok=True)
            fs.work.mkdir(exist_ok=True)
            if upper_from is not None:
                _copy_tree(upper_from, fs.upper)
            fs.root.mkdir(exist_ok=True)
            fs._mount_overlay(lower_dirs)
        except OSError as exc:
            fs.unmount()
            if exc.errno == errno.ENOSPC:
                raise LimitsError(
                    f"the sandbox's changes do not fit in disk_mb={disk_mb}",
                    hint="raise the disk limit",
                ) from exc
            raise BackendError(f"cannot mount the sandbox rootfs: {exc}") from exc
        except BaseException:
            fs.unmount()
            raise
        return fs

    def _mount_overlay(self, lower_dirs: list[Path]) -> None:
        # The kernel shows the option strings as given in /proc/self/mountinfo, which a
        # sandbox can read: mount with paths relative to the sandbox dir (short symlinks to
        # the layers) so no host path leaks in, and so many layers fit in one mount.
        links = self.sandbox_dir / "l"
        links.mkdir(exist_ok=True)
        names = []
        for i, d in enumerate(reversed(lower_dirs)):
            link = links / str(i)
            if link.is_symlink():
                link.unlink()
            link.symlink_to(d.resolve())
            names.append(f"l/{i}")
        upper = self.upper.relative_to(self.sandbox_dir)
        work = self.work.relative_to(self.sandbox_dir)
        rel = f"lowerdir={':'.join(names)},upperdir={upper},workdir={work}"
        if len(rel) > _OPTION_LIMIT:
            raise BackendError(f"too many layers ({len(names)}) for one overlay mount")
        # The working directory is process-wide: serialise the chdir among threads.
        with _CWD_LOCK:
            cwd = os.open(".", os.O_RDONLY)
            try:
                os.chdir(self.sandbox_dir)
                sys_mount("overlay", self.root, "overlay", rel)
            finally:
                os.fchdir(cwd)
                os.close(cwd)

    def is_mounted(self) -> bool:
        """True when the overlay is mounted."""
        return is_mountpoint(self.root)

    def unmount(self) -> None:
        """Unmount the overlay then the tmpfs (idempotent; lazily as a last resort)."""
        try:
            unmount_tree(self.root)
            unmount_tree(self.upperfs)
        except OSError as exc:
            raise BackendError(f"cannot unmount {self.sandbox_dir}: {exc}") from exc

    def disk_used(self) -> int:
        """Bytes the sandbox has written on top of its baseline."""
        if is_mountpoint(self.upperfs):
            st = os.statvfs(self.upperfs)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        total = 0
        for dirpath, _dirs, files in os.walk(self.upper):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except FileNotFoundError:
                    continue
        return total


def _copy_tree(src: Path, dest: Path) -> None:
    """Copy ``src``'s contents into ``dest`` keeping owners, modes, xattrs, device nodes
    (overlay whiteouts) and hard links."""
    proc = subprocess.run(
        ["cp", "-a", "--reflink=auto", f"{src}/.", str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        err = errno.ENOSPC if "No space left" in proc.stderr else errno.EIO
        raise OSError(err, f"copying {src} failed: {proc.stderr.strip()}")


def orphan_mounts(home: Home, live_ids: set[str]) -> list[str]:
    """Mount points below ``home``'s sandbox dirs that belong to no live sandbox."""
    out = []
    base = home.sandboxes
    for mp in mounts_under(base):
        rel = mp.relative_to(base).parts
        if rel and rel[0] not in live_ids:
            out.append(str(mp))
    return out


def remove_orphan_mounts(home: Home, live_ids: set[str], dry_run: bool) -> list[str]:
    """Unmount (unless ``dry_run``) the orphan mounts; one line per mount."""
    out = []
    for mp in orphan_mounts(home, live_ids):
        if not dry_run:
            unmount_tree(Path(mp))
        out.append(f"mount {mp}")
    return out


def remove_sandbox_dir(sandbox_dir: Path) -> None:
    """Unmount whatever is left below ``sandbox_dir`` and delete it (idempotent).

    Refuses to recurse into a still-mounted tree, so a failed unmount never deletes
    baseline layers through the overlay.
    """
    unmount_tree(sandbox_dir)
    if mounts_under(sandbox_dir):
        raise BackendError(f"{sandbox_dir} still has mounts; not deleting it")
    shutil.rmtree(sandbox_dir, ignore_errors=True)
