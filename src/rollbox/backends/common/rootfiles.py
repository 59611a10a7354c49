"""File access to a sandbox's root from the host without ever leaving that root (namespace and
gVisor sandboxes; moved here from ``backends/namespace/files.py``).

Every sandbox path is normalised lexically (a ``..`` above ``/`` is refused), then opened
with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` relative to a descriptor of the
root: the kernel resolves it as if chrooted there (an absolute symlink starts at the
sandbox's root, ``..`` stops at it), so nothing resolves to a host path — the contract of
:mod:`rollbox.backends.common.copylinks`, the same as inside a gVisor or microVM sandbox.
Only regular files, directories and symlinks are read or written, so a device node or FIFO
made inside cannot make the host read a host device or block.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollbox.backends.common.copylinks import LinkPolicy, in_tree_text, resolve_lexically
from rollbox.backends.common.paths import normalize as normalize  # re-exported
from rollbox.errors import (
    InvalidInputError,
    IsADirectoryInSandboxError,
    NotFoundError,
    PathEscapeError,
    SandboxFileNotFoundError,
)

SYS_OPENAT2 = 437  # x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
_RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
OPENAT2_RETRIES = 16

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = _RESOLVE) -> int:
    """``openat2(2)``; raises ``OSError`` with the errno.

    ``EAGAIN`` (a rename inside raced a ``..`` lookup, so the kernel could not vouch for
    it) is retried a few times, as the man page suggests.
    """
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    for _ in range(OPENAT2_RETRIES):
        fd = _libc.syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(path.encode()),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    raise OSError(err, os.strerror(err), path)


def _translate(exc: OSError, path: str) -> Exception:
    if exc.errno in (errno.EXDEV, errno.ELOOP):
        return PathEscapeError(
            f"sandbox path {path!r} resolves outside the sandbox root (symlink or '..')"
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return SandboxFileNotFoundError(f"no such file in the sandbox: {path}")
    if exc.errno == errno.EISDIR:
        return IsADirectoryInSandboxError(f"{path} is a directory in the sandbox")
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
        """An ``O_PATH`` descriptor of directory ``rel`` (made, parents first, if ``create``).

        Every lookup starts at the root's descriptor: with ``RESOLVE_IN_ROOT`` the
        descriptor is the root a symlink's absolute target and ``..`` are resolved against.
        """
        if not rel:
            return os.dup(rootfd)
        try:
            return openat2(rootfd, rel, os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            if not (create and exc.errno == errno.ENOENT):
                raise _translate(exc, path) from None
        parts = rel.split("/")
        for i, comp in enumerate(parts):
            prefix = "/".join(parts[: i + 1])
            try:
                os.close(openat2(rootfd, prefix, os.O_PATH | os.O_DIRECTORY))
                continue
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise _translate(exc, path) from None
            parent = self._open_dir(rootfd, "/".join(parts[:i]), path, create=False)
            try:
                os.mkdir(comp, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            except OSError as exc:
                raise _translate(exc, path) from None
            finally:
                os.close(parent)
        try:
            return openat2(rootfd, rel, os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            raise _translate(exc, path) from None

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
                    raise IsADirectoryInSandboxError(f"{path} is a directory in the sandbox")
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
        with self._root_fd() as rootfd:
            os.close(self._open_dir(rootfd, posixpath.dirname(rel), path, create=True))
            self._write_at(rootfd, rel, data, mode, path)

    def _write_at(self, rootfd: int, rel: str, data: bytes, mode: int, path: str) -> None:
        """Write the file at ``rel``: its directory resolves with chroot semantics; a
        symlink at ``rel`` itself is replaced, not written through (as the microVM guest's
        write-and-rename does)."""
        parent, name = posixpath.split(rel)
        pfd = self._open_dir(rootfd, parent, path, create=False)
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISLNK(os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=pfd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW
            fd = openat2(pfd, name, flags, mode)
        except OSError as exc:
            raise _translate(exc, path) from None
        finally:
            os.close(pfd)
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
        """Copy the host file or tree ``src`` to ``dest`` (symlinks are copied as links;
        links already inside resolve with chroot semantics, never to a host path)."""
        if not src.exists() and not src.is_symlink():
            raise NotFoundError(f"no such host path: {src}")
        if not src.is_dir() or src.is_symlink():
            if src.is_symlink():
                raise InvalidInputError(f"{src} is a symlink; upload its target or a directory")
            self.write(dest, src.read_bytes(), src.stat().st_mode & 0o7777)
            return
        rel = normalize(dest)
        with self._root_fd() as rootfd:
            os.close(self._open_dir(rootfd, rel, dest, create=True))
            self._upload_tree(rootfd, src, rel, dest)

    def _upload_tree(self, rootfd: int, src: Path, rel: str, dest: str) -> None:
        dirfd = self._open_dir(rootfd, rel, dest, create=False)
        try:
            for entry in os.scandir(src):
                where = posixpath.join(dest, entry.name)
                sub = posixpath.join(rel, entry.name) if rel else entry.name
                if entry.is_symlink():
                    try:
                        os.unlink(entry.name, dir_fd=dirfd)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        raise _translate(exc, where) from None
                    os.symlink(os.readlink(entry.path), entry.name, dir_fd=dirfd)
                elif entry.is_dir():
                    os.close(self._open_dir(rootfd, sub, where, create=True))
                    self._upload_tree(rootfd, Path(entry.path), sub, where)
                elif entry.is_file():
                    data = Path(entry.path).read_bytes()
                    self._write_at(rootfd, sub, data, entry.stat().st_mode & 0o7777, where)
        finally:
            os.close(dirfd)

    def download(self, src: str, dest: Path, links: LinkPolicy = "refuse") -> None:
        """Copy the file or tree ``src`` to the host path ``dest``.

        ``src`` itself resolves with chroot semantics (a link to a file is followed inside
        the sandbox). In a tree, links to places inside the tree stay links (written
        relative); links out of it are refused or, with ``links="content"``, replaced by
        what they point to.

        Raises:
            PathEscapeError: a link in the tree points out of it (``links="refuse"``).
        """
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
                    self._download_tree(rootfd, fd, dest, "/" + rel, "/" + rel, links, set())
                elif stat.S_ISREG(st.st_mode):
                    if dest.is_dir() and not dest.is_symlink():  # as cp FILE DIR (and microvm)
                        dest = dest / (posixpath.basename(rel) or "file")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    _replace_link(dest)
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

    def _download_tree(
        self,
        rootfd: int,
        dirfd: int,
        dest: Path,
        where: str,
        top: str,
        links: LinkPolicy,
        seen: set[tuple[int, int]],
    ) -> None:
        st = os.fstat(dirfd)
        if (st.st_dev, st.st_ino) in seen:  # a link (content mode) led back up the tree
            raise PathEscapeError(f"{where} in the sandbox loops back into the copied tree")
        seen = seen | {(st.st_dev, st.st_ino)}
        rfd = openat2(dirfd, ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = os.listdir(rfd)
        finally:
            os.close(rfd)
        for name in names:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                text = os.readlink(name, dir_fd=dirfd) if stat.S_ISLNK(st.st_mode) else ""
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed while copying (as cp -r: it vanished)
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # no longer a link: replaced while copying
                    continue
                raise
            target = dest / name
            sub_where = posixpath.join(where, name)
            if stat.S_ISLNK(st.st_mode):
                rel_text = in_tree_text(sub_where, text, top)
                _replace_link(target)
                if rel_text is not None:
                    os.symlink(rel_text, target)
                    continue
                pointed = resolve_lexically(sub_where, text)
                if links == "refuse":
                    raise PathEscapeError(
                        f"{sub_where} in the sandbox is a link out of the copied tree (-> {text})",
                        hint="copy it with links='content' (CLI: --links content) to get "
                        "what it points to",
                    )
                self._link_content(rootfd, pointed, target, top, links, seen)
            elif stat.S_ISDIR(st.st_mode):
                target.mkdir(exist_ok=True)
                try:
                    sub = openat2(dirfd, name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
                except OSError as exc:
                    raise _translate(exc, sub_where) from None
                try:
                    self._download_tree(rootfd, sub, target, sub_where, top, links, seen)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                _replace_link(target)
                self._copy_file_out(dirfd, name, target, st.st_mode, sub_where)

    def _link_content(
        self,
        rootfd: int,
        pointed: str,
        target: Path,
        top: str,
        links: LinkPolicy,
        seen: set[tuple[int, int]],
    ) -> None:
        """Copy what a link out of the tree points to (chroot semantics) to ``target``;
        a dangling link is left out."""
        try:
            fd = openat2(rootfd, pointed.lstrip("/") or ".", os.O_PATH)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return
            raise _translate(exc, pointed) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                target.mkdir(exist_ok=True)
                self._download_tree(rootfd, fd, target, pointed, pointed, links, seen)
            elif stat.S_ISREG(st.st_mode):
                self._copy_file_out(fd, "", target, st.st_mode, pointed)
        finally:
            os.close(fd)


def _replace_link(path: Path) -> None:
    """Remove a host symlink at ``path`` before writing there (never write through it)."""
    if path.is_symlink():
        path.unlink()
