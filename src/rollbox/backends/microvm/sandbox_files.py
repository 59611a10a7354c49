"""File operations of a microVM sandbox: read/write, upload, download.

The contract is :mod:`~rollbox.backends.common.copylinks`'s. Single files travel through the
C guest agent; trees as tar, extracted on the host by :func:`safe_extract` (the guest is not
trusted).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollbox.backends.common.copylinks import LinkPolicy, in_tree_text, resolve_lexically
from rollbox.backends.microvm.guest_agent import T_DATA, jframe
from rollbox.backends.microvm.sandbox_base import VMSandboxBase, normalize, raise_agent_error
from rollbox.errors import (
    BackendError,
    InvalidInputError,
    NotFoundError,
    PathEscapeError,
    SandboxFileNotFoundError,
)


def safe_extract(f: Any, dest: Path) -> None:
    """Extract a tar produced by the (untrusted) guest: no absolute paths, no ``..``, no
    links leaving ``dest``, no device nodes; modes and owners kept."""

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        if member.isdev():
            raise tarfile.FilterError(f"device node {member.name!r} refused")
        checked = tarfile.tar_filter(member, path)
        return checked.replace(mode=member.mode, deep=False)

    with tarfile.open(fileobj=f, mode="r|") as tar:
        tar.extractall(dest, filter=keep, numeric_owner=True)


class VMSandboxFiles(VMSandboxBase):
    """File operations of a microVM sandbox."""

    async def _fetch(self, op: str, path: str, sink: Callable[[bytes], object]) -> None:
        async with self._session() as ch:
            rid = ch.new_id()
            await ch.send(jframe({"id": rid, "op": op, "path": path}))

            def on_frame(kind: int, payload: bytes) -> None:
                if kind == T_DATA:
                    sink(payload)

            reply = await ch.reply(rid, on_frame)
        if "error" in reply:
            raise_agent_error(reply["error"], path)

    async def _push(self, req: dict[str, Any], data: bytes, path: str) -> None:
        async with self._session() as ch:
            rid = ch.new_id()
            await ch.send(jframe({"id": rid, **req}))
            await ch.send_data(rid, data)
            reply = await ch.reply(rid)
        if "error" in reply:
            raise_agent_error(reply["error"], path)

    async def read_file(self, path: str) -> bytes:
        p = normalize(path)
        self._usable()
        buf = bytearray()
        await self._fetch("read_file", p, buf.extend)
        return bytes(buf)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        p = normalize(path)
        if p == "/":
            raise InvalidInputError("cannot write a file at /")
        self._usable()
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._push({"op": "write_file", "path": p, "mode": mode}, raw, p)

    async def upload(self, src: Path, dest: str) -> None:
        p = normalize(dest)
        self._usable()
        if not src.exists() and not src.is_symlink():
            raise NotFoundError(f"no such host path: {src}")
        if src.is_file() and not src.is_symlink():
            await self.write_file(p, src.read_bytes(), mode=src.stat().st_mode & 0o7777)
            return
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for child in sorted(src.iterdir()) if src.is_dir() else [src]:
                    tar.add(child, arcname=child.name)
            f.seek(0)
            await self._push({"op": "put_tar", "dest": p}, f.read(), p)

    async def download(self, src: str, dest: Path, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or tree out; the contract of :mod:`~rollbox.backends.common.copylinks`
        (the guest resolves paths with chroot semantics; the host rewrites or refuses links
        in the extracted tree before anything reaches ``dest``)."""
        p = normalize(src)
        await self._download(p, dest, links, 0, posixpath.basename(p) or "root")

    async def _download(self, p: str, dest: Path, links: LinkPolicy, depth: int, name: str) -> None:
        """``name``: what ``src`` is called (a link's own name, not its target's)."""
        if depth > 40:  # as the kernel's ELOOP: links (content mode) leading round
            raise PathEscapeError(f"{p}: too many levels of symlinks in the sandbox")
        self._usable()
        async with self._session() as ch:
            st = await ch.call("stat", path=p)  # lstat in the guest: C, no helper process
        if "error" in st:
            raise_agent_error(st["error"], p)
        if not st.get("exists"):
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {p}")
        if st.get("link"):  # follow it inside the sandbox (the guest's own root)
            await self._download(str(st["realpath"]), dest, links, depth + 1, name)
            return
        if st.get("reg"):  # a single file: read by the C agent, no tar helper
            buf = bytearray()
            await self._fetch("read_file", p, buf.extend)
            if dest.is_dir() and not dest.is_symlink():
                dest = dest / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink():  # never write through a host link
                dest.unlink()
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(buf)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, int(st.get("mode", 0o644)) & 0o777)
            finally:
                os.close(fd)
            return
        if not st.get("dir") and "reg" in st:  # ("reg" missing: an agent from before it)
            raise InvalidInputError(f"{p} is not a regular file or directory in the sandbox")
        self.home.tmp.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.home.tmp) as f:
            await self._fetch("get_tar", p, f.write)
            f.seek(0)
            with tempfile.TemporaryDirectory(dir=self.home.tmp) as stage:
                safe_extract(f, Path(stage))
                entries = os.listdir(stage)
                if len(entries) != 1:
                    raise BackendError(f"download of {p}: unexpected archive from the guest")
                item = Path(stage) / entries[0]
                if item.is_symlink():  # src itself is a link: follow it inside the sandbox
                    pointed = resolve_lexically(p, os.readlink(item))
                    await self._download(pointed, dest, links, depth + 1, name)
                    return
                if item.is_dir():
                    await self._fix_links(item, p, p, links, depth)
                if dest.is_dir() and not dest.is_symlink() and item.is_dir():
                    dest = dest / name if dest.exists() and any(dest.iterdir()) else dest
                dest.parent.mkdir(parents=True, exist_ok=True)
                if item.is_dir():
                    shutil.copytree(item, dest, symlinks=True, dirs_exist_ok=True)
                else:
                    if dest.is_dir() and not dest.is_symlink():
                        dest = dest / name
                    if dest.is_symlink():  # never write through a host link
                        dest.unlink()
                    os.replace(item, dest) if not dest.exists() else shutil.move(item, dest)

    async def _fix_links(
        self, stage: Path, where: str, top: str, links: LinkPolicy, depth: int
    ) -> None:
        """Links in an extracted tree: in-tree ones rewritten relative, others refused or
        replaced by what they point to (fetched from the guest)."""
        for entry in sorted(os.scandir(stage), key=lambda e: e.name):
            sub = posixpath.join(where, entry.name)
            if entry.is_symlink():
                text = os.readlink(entry.path)
                os.unlink(entry.path)
                rel_text = in_tree_text(sub, text, top)
                if rel_text is not None:
                    os.symlink(rel_text, entry.path)
                elif links == "refuse":
                    raise PathEscapeError(
                        f"{sub} in the sandbox is a link out of the copied tree (-> {text})",
                        hint="copy it with links='content' (CLI: --links content) to get "
                        "what it points to",
                    )
                else:
                    with contextlib.suppress(NotFoundError):  # a dangling link is left out
                        await self._download(
                            resolve_lexically(sub, text),
                            Path(entry.path),
                            links,
                            depth + 1,
                            entry.name,
                        )
            elif entry.is_dir(follow_symlinks=False):
                await self._fix_links(Path(entry.path), sub, top, links, depth)
