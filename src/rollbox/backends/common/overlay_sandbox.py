"""The sandbox handle shared by the ``namespace`` and ``gvisor`` backends.

State (``state.json``, re-read only when it changed), host-side file access below the
overlay root (:mod:`rollbox.backends.common.rootfiles`), snapshot and fork through the
upper dir, freezer pause, destroy, and the exec preparation both share
(:mod:`rollbox.backends.common.execprep`). A subclass implements ``exec``: how a command
reaches the agent and how its process tree is found and killed differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbox.backends.agent.client import AgentClient
from rollbox.backends.base import SandboxHandle
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.common.copylinks import LinkPolicy
from rollbox.backends.common.execprep import PreparedExec, prepare_exec, user_files
from rollbox.backends.common.rootfiles import RootFiles
from rollbox.backends.common.rootfs import Rootfs
from rollbox.backends.state import read_state, sandbox_dir, write_state
from rollbox.errors import (
    InvalidInputError,
    RollboxError,
    SandboxNotFoundError,
    SandboxStateError,
)
from rollbox.models import SandboxInfo

if TYPE_CHECKING:
    from rollbox.backends.common.overlay_backend import OverlayBackend


class OverlaySandbox(SandboxHandle):
    """One live sandbox of an :class:`~rollbox.backends.common.overlay_backend.OverlayBackend`."""

    def __init__(self, backend: OverlayBackend, info: SandboxInfo) -> None:
        self.backend = backend
        self.home = backend.home
        self._info = info
        self.dir = sandbox_dir(self.home, info.id)
        self.cgroup = Cgroup.open(self.home.tag, info.id)
        self.rootfs = Rootfs.open(self.dir)
        self.files = RootFiles(self.rootfs.root)
        self.client = AgentClient(self.dir / "run" / "agent.sock")
        self._state_key: tuple[int, int, int] | None = None

    @property
    def info(self) -> SandboxInfo:
        """The sandbox's state record."""
        return self._info

    def _note_state_file(self) -> None:
        """Remember state.json as just written from ``self._info``, so the first file or
        exec call does not parse it back (one model validation per sandbox saved)."""
        try:
            st = os.stat(self.dir / "state.json")
        except FileNotFoundError:
            return
        self._state_key = (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> SandboxInfo:
        # Another process may have paused or destroyed the sandbox: re-read state.json,
        # but only when it changed (a stat instead of a parse on every exec).
        try:
            st = os.stat(self.dir / "state.json")
        except FileNotFoundError:
            self._info = self._info.model_copy(update={"state": "destroyed"})
            return self._info
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._state_key:
            try:
                self._info = read_state(self.home, self.id)
                self._state_key = key
            except SandboxNotFoundError:
                self._info = self._info.model_copy(update={"state": "destroyed"})
        return self._info

    def _require_running(self) -> None:
        state = self._refresh().state
        if state == "destroyed":
            raise SandboxStateError(f"sandbox {self.id} is destroyed")
        if state == "paused":
            raise SandboxStateError(f"sandbox {self.id} is paused", hint="resume it first")
        if state != "running":
            raise SandboxStateError(f"sandbox {self.id} is {state}")

    def _require_live(self) -> None:
        if self._refresh().state == "destroyed":
            raise SandboxStateError(f"sandbox {self.id} is destroyed")

    # ------------------------------------------------------------------ exec

    def _prepare(self, cmd: list[str] | str, **kw: Any) -> PreparedExec:
        """The exec checked and resolved by the shared helper (/etc/passwd read from the
        host side, only for a user other than root)."""
        texts: dict[str, str] = {}
        for path in user_files(self.info, kw.get("user")):
            with contextlib.suppress(RollboxError, OSError):
                texts[path] = self.files.read(path).decode(errors="replace")
        passwd, group = texts.get("/etc/passwd"), texts.get("/etc/group")
        return prepare_exec(self.info, cmd, passwd=passwd, group=group, **kw)

    # ------------------------------------------------------------------ files

    async def read_file(self, path: str) -> bytes:
        """Read a file inside (resolved safely below the root)."""
        self._require_live()
        return await asyncio.to_thread(self.files.read, path)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write a file inside (parents made; resolved safely below the root)."""
        self._require_live()
        raw = data.encode() if isinstance(data, str) else data
        await asyncio.to_thread(self.files.write, path, raw, mode)

    async def upload(self, src: Path, dest: str) -> None:
        """Copy a host file or tree into the sandbox."""
        self._require_live()
        await asyncio.to_thread(self.files.upload, src, dest)

    async def download(self, src: str, dest: Path, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or tree out of the sandbox; see :meth:`SandboxHandle.download`."""
        self._require_live()
        await asyncio.to_thread(self.files.download, src, dest, links)

    # ------------------------------------------------------------------ snapshot / fork

    async def snapshot(self, *, name: str | None = None) -> str:
        """The current filesystem changes as a new baseline (parent recorded)."""
        self._require_live()
        return await asyncio.to_thread(self._snapshot_sync, name)

    def _snapshot_sync(self, name: str | None) -> str:
        from rollbox.baselines.store import BaselineStore
        from rollbox.models import SnapshotSource

        with self._frozen():
            info = BaselineStore(self.home).commit_snapshot(
                self.info.baseline,
                self.rootfs.upper,
                SnapshotSource(sandbox_id=self.id, backend=self.backend.name),
                name=name,
            )
        return info.digest

    @contextlib.contextmanager
    def _frozen(self) -> Any:
        was_frozen = self.cgroup.is_frozen()
        if not was_frozen:
            self.cgroup.freeze()
        try:
            yield
        finally:
            if not was_frozen:
                self.cgroup.thaw()

    async def fork(self, n: int) -> list[SandboxHandle]:
        """``n`` independent sandboxes seeded with a copy of this one's changes."""
        if n < 1:
            raise InvalidInputError("fork needs n >= 1")
        self._require_live()
        return await asyncio.to_thread(self._fork_sync, n)

    def _fork_sync(self, n: int) -> list[SandboxHandle]:
        from rollbox.baselines.store import BaselineStore

        baseline = BaselineStore(self.home).resolve(self.info.baseline)
        spec = self.info.spec.model_copy()
        out: list[SandboxHandle] = []
        try:
            with self._frozen():
                for _ in range(n):
                    out.append(self.backend._create_sync(spec, baseline, self.rootfs.upper))
        except BaseException:
            for h in out:
                assert isinstance(h, OverlaySandbox)
                with contextlib.suppress(RollboxError):
                    self.backend._teardown(h.info)
            raise
        return out

    # ------------------------------------------------------------------ lifecycle

    async def pause(self) -> None:
        """Freeze every process inside."""
        self._require_running()
        await asyncio.to_thread(self.cgroup.freeze)
        self._set_state("paused")

    async def resume(self) -> None:
        """Thaw a paused sandbox."""
        state = self._refresh().state
        if state == "destroyed":
            raise SandboxStateError(f"sandbox {self.id} is destroyed")
        await asyncio.to_thread(self.cgroup.thaw)
        self._set_state("running")

    def _set_state(self, state: str) -> None:
        info = self._refresh().model_copy(update={"state": state})
        write_state(self.home, info)
        self._info = info

    async def destroy(self) -> None:
        """Kill everything inside and remove every host resource (idempotent)."""
        await asyncio.to_thread(self.destroy_sync)

    def destroy_sync(self) -> None:
        """Blocking :meth:`destroy`."""
        self.backend._teardown(self._info)
        self._info = self._info.model_copy(update={"state": "destroyed"})


__all__ = ["OverlaySandbox"]
