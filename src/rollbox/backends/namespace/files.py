"""File access to a sandbox's root from the host without ever leaving that root.

Every sandbox path is normalised lexically (a ``..`` above ``/`` is refused), then opened
with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`` relative to a descriptor of the
root: the kernel refuses (``EXDEV``) any resolution that would leave the root, including
through absolute symlinks or symlinks with too many ``..``. Only regular files, directories
and symlinks (copied as links, never followed out) are read or written, so a device node
or FIFO made inside cannot make the host read a host device or block.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollbox.errors import InvalidInputError, NotFoundError, PathEscapeError

SYS_OPENAT2 = 437  # x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = _RESOLVE) -> int:
    """``openat2(2)``; raises ``OSError`` with the errno."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(path.encode()),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def normalize(path: str, cwd: str = "/") -> str:
    """``path`` (absolute, or relative to ``cwd``) as a root-relative path ("" for ``/``).

    Raises:
        PathEscapeError: ``..`` climbs above ``/``.
        InvalidInputError: the path is empty or contains a NUL byte.
    """
    if not path or "\0" in path:
        raise InvalidInputError(f"invalid sandbox path {path!r}")
    full = path if path.startswith("/") else posixpath.join(cwd, path)
    parts: list[str] = []
    for comp in full.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise PathEscapeError(f"sandbox path {path!r} escapes the sandbox root")
            parts.pop()
        else:
            parts.append(comp)
    return "/".join(parts)


def _translate(exc: OSError, path: str) -> Exception:
    if exc.errno in (errno.EXDEV, errno.ELOOP):
        return PathEscapeError(
            f"sandbox path {path!r} resolves outside the sandbox root (symlink or '..')"
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NotFoundError(f"no such file in the sandbox: {path}")
    if exc.errno == errno.EISDIR:
        return InvalidInputError(f"{path} is a directory in the sandbox")
    if exc.errno == errno.ENOSPC:
        from rollbox.errors import LimitsError

        return LimitsError(f"the sandbox's disk limit is reached writing {path}")
    return exc


class RootFiles:
    """Safe file operations below one root directory (a sandbox's mounted rootfs)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, rootfd: int, rel: str, path: str, create: bool) -> int:
        """An ``O_PATH`` descriptor of directory ``rel`` (made, parents first, if ``create``)."""
        if not rel:
            return os.dup(rootfd)
        try:
            return openat2(rootfd, rel, os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            if not (create and exc.errno == errno.ENOENT):
                raise _translate(exc, path) from None
        fd = os.dup(rootfd)
        try:
            for comp in rel.split("/"):
                try:
                    os.mkdir(comp, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _translate(exc, path) from None
                try:
                    nfd = openat2(fd, comp, os.O_PATH | os.O_DIRECTORY)
                except OSError as exc:
                    raise _translate(exc, path) from None
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def read(self, path: str) -> bytes:
        """Contents of the regular file ``path``."""
        rel = normalize(path)
        with self._root_fd() as rootfd:
            try:
                fd = openat2(rootfd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError as exc:
                raise _translate(exc, path) from None
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    raise InvalidInputError(f"{path} is a directory in the sandbox")
                if not stat.S_ISREG(st.st_mode):
                    raise InvalidInputError(f"{path} is not a regular file in the sandbox")
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace the file ``path`` with ``data`` (parents are made)."""
        rel = normalize(path)
        if not rel:
            raise InvalidInputError("cannot write to the sandbox root directory itself")
        parent, name = posixpath.split(rel)
        with self._root_fd() as rootfd:
            pfd = self._open_dir(rootfd, parent, path, create=True)
            try:
                self._write_at(pfd, name, data, mode, path)
            finally:
                os.close(pfd)

    def _write_at(self, dirfd: int, name: str, data: bytes, mode: int, path: str) -> None:
        try:
            fd = openat2(dirfd, name, os.O_WRONLY | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK, mode)
        except OSError as exc:
            raise _translate(exc, path) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidInputError(f"{path} is not a regular file in the sandbox")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fchmod(fd, mode)
        except OSError as exc:
            raise _translate(exc, path) from None
        finally:
            os.close(fd)

    def upload(self, src: Path, dest: str) -> None:
        """Copy the host file or tree ``src`` to ``dest`` (symlinks are copied as links)."""
        if not src.exists() and not src.is_symlink():
            raise NotFoundError(f"no such host path: {src}")
        if not src.is_dir() or src.is_symlink():
            if src.is_symlink():
                raise InvalidInputError(f"{src} is a symlink; upload its target or a directory")
            self.write(dest, src.read_bytes(), src.stat().st_mode & 0o7777)
            return
        rel = normalize(dest)
        with self._root_fd() as rootfd:
            top = self._open_dir(rootfd, rel, dest, create=True)
            try:
                self._upload_tree(src, top, dest)
            finally:
                os.close(top)

    def _upload_tree(self, src: Path, dirfd: int, dest: str) -> None:
        for entry in os.scandir(src):
            where = posixpath.join(dest, entry.name)
            if entry.is_symlink():
                try:
                    os.unlink(entry.name, dir_fd=dirfd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise _translate(exc, where) from None
                os.symlink(os.readlink(entry.path), entry.name, dir_fd=dirfd)
            elif entry.is_dir():
                sub = self._open_dir(dirfd, entry.name, where, create=True)
                try:
                    self._upload_tree(Path(entry.path), sub, where)
                finally:
                    os.close(sub)
            elif entry.is_file():
                data = Path(entry.path).read_bytes()
                self._write_at(dirfd, entry.name, data, entry.stat().st_mode & 0o7777, where)

    def download(self, src: str, dest: Path) -> None:
        """Copy the file or tree ``src`` to the host path ``dest`` (links stay links)."""
        rel = normalize(src)
        with self._root_fd() as rootfd:
            try:
                fd = openat2(rootfd, rel, os.O_PATH) if rel else os.dup(rootfd)
            except OSError as exc:
                raise _translate(exc, src) from None
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    dest.mkdir(parents=True, exist_ok=True)
                    self._download_tree(fd, dest, src)
                elif stat.S_ISREG(st.st_mode):
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    self._copy_file_out(fd, "", dest, st.st_mode, src)
                else:
                    raise InvalidInputError(f"{src} is not a regular file or directory")
            finally:
                os.close(fd)

    def _copy_file_out(self, dirfd: int, name: str, dest: Path, mode: int, where: str) -> None:
        if name:
            try:
                fd = openat2(dirfd, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError as exc:
                raise _translate(exc, where) from None
        else:
            fd = os.open(f"/proc/self/fd/{dirfd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode & 0o777)
            try:
                while chunk := os.read(fd, 1 << 20):
                    os.write(out, chunk)
            finally:
                os.close(out)
        finally:
            os.close(fd)

    def _download_tree(self, dirfd: int, dest: Path, where: str) -> None:
        rfd = openat2(dirfd, ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = os.listdir(rfd)
        finally:
            os.close(rfd)
        for name in names:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            target = dest / name
            sub_where = posixpath.join(where, name)
            if stat.S_ISLNK(st.st_mode):
                if target.is_symlink() or target.exists():
                    target.unlink()
                os.symlink(os.readlink(name, dir_fd=dirfd), target)
            elif stat.S_ISDIR(st.st_mode):
                target.mkdir(exist_ok=True)
                sub = openat2(dirfd, name, os.O_PATH | os.O_DIRECTORY)
                try:
                    self._download_tree(sub, target, sub_where)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                self._copy_file_out(dirfd, name, target, st.st_mode, sub_where)
