"""The plumbing of a microVM sandbox handle: its record, its QEMU's liveness, the agent connection.

The handle, :class:`~.sandbox.MicroVMSandbox`, is one class built in layers, one module each:
this base, :mod:`.sandbox_files` (file copies), :mod:`.sandbox_snapshots` (filesystem and
memory snapshots, fork) and :mod:`.sandbox` (exec, pause/resume, destroy). Each layer uses
only the ones below it. Also here: the helpers they share (path normalisation, the mapping of
guest-agent errors to rollbox exceptions).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbox.backends.base import (
    SandboxHandle,
)
from rollbox.backends.common.paths import normalize as root_relative
from rollbox.backends.microvm import qemu
from rollbox.backends.microvm.channel import AgentChannel, ChannelClosed
from rollbox.backends.state import (
    read_state,
    sandbox_dir,
    write_state,
)
from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    InvalidInputError,
    IsADirectoryInSandboxError,
    PathEscapeError,
    SandboxCrashedError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxStateError,
)
from rollbox.models import (
    SandboxInfo,
)

if TYPE_CHECKING:
    from rollbox.backends.microvm.lifecycle import VMLifecycle


def normalize(path: str) -> str:
    """An absolute, lexically normalised sandbox path.

    Raises:
        PathEscapeError: ``..`` climbs above ``/``.
        InvalidInputError: empty or containing NUL.
    """
    return "/" + root_relative(path)


def extra_list(info: SandboxInfo, key: str) -> list[str]:
    value = info.extra.get(key)
    return [str(x) for x in value] if isinstance(value, list) else []


def extra_int(info: SandboxInfo, key: str, default: int) -> int:
    value = info.extra.get(key)
    return value if isinstance(value, int) else default


def raise_agent_error(err: dict[str, Any], path: str = "") -> None:
    kind = err.get("type")
    msg = err.get("message", "")
    if kind == "escape":
        raise PathEscapeError(f"sandbox path {path or msg!r} resolves outside the sandbox root")
    if kind == "not_found":
        raise SandboxFileNotFoundError(f"no such file in the sandbox: {path or msg}")
    if kind == "is_dir":
        raise IsADirectoryInSandboxError(f"{path}: {msg}")
    if kind in ("not_dir", "user"):
        raise InvalidInputError(f"{msg}" if kind == "user" else f"{path}: {msg}")
    if kind == "nopython":  # the baseline lacks what this operation needs in the guest
        raise InvalidInputError(msg)
    raise BackendError(f"guest agent: {msg}")


class VMSandboxBase(SandboxHandle):
    """A microVM sandbox's state, liveness and agent connection (the plumbing)."""

    def __init__(self, backend: VMLifecycle, info: SandboxInfo) -> None:
        self.backend = backend
        self._info = info
        self._ch: AgentChannel | None = None
        self._users = 0
        self._lock: asyncio.Lock | None = None

    @property
    def info(self) -> SandboxInfo:
        return self._info

    @property
    def home(self) -> Home:
        return self.backend.home

    @property
    def dir(self) -> Path:
        return sandbox_dir(self.home, self.id)

    @property
    def rdir(self) -> Path:
        return Path(str(self._info.extra["run_dir"]))

    @property
    def vm(self) -> qemu.VMConfig:
        vm = self._info.extra["vm"]
        assert isinstance(vm, dict)
        return qemu.VMConfig.from_json(vm)

    @property
    def pid(self) -> int | None:
        pid = self._info.extra.get("qemu_pid")
        return int(pid) if isinstance(pid, int) else None

    def alive(self) -> bool:
        """True while this sandbox's QEMU runs."""
        return qemu.alive(self.pid, self.vm.name)

    def _save(self) -> None:
        write_state(self.home, self._info)

    def _refresh(self) -> None:
        with contextlib.suppress(SandboxNotFoundError):
            self._info = read_state(self.home, self.id)

    def _usable(self, *, allow_paused: bool = False) -> None:
        self._refresh()
        if self._info.state == "destroyed" or not self.dir.exists():
            raise SandboxStateError(f"sandbox {self.id} is destroyed")
        if self._info.state == "paused" and not allow_paused:
            raise SandboxStateError(f"sandbox {self.id} is paused", hint="resume it first")
        if not self.alive():
            self._crashed()

    def _crashed(self) -> None:
        if self.dir.exists():
            self._info.state = "crashed"
            with contextlib.suppress(OSError):
                self._save()
        tail = self.console_tail()
        raise SandboxCrashedError(
            f"the VM of sandbox {self.id} is gone (QEMU pid {self.pid} died)"
            + (f": {tail}" if tail else "")
        )

    def console_tail(self) -> str:
        """The last line the guest printed on its console, if any."""
        try:
            lines = Path(self.vm.console_log).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][-300:] if lines else ""

    @contextlib.asynccontextmanager
    async def _session(self, timeout: float = 60.0) -> AsyncIterator[AgentChannel]:
        """The agent connection, shared by this handle's concurrent requests."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._ch is None or self._ch.closed:
                try:
                    self._ch = await AgentChannel.connect(
                        self.rdir / "agent.sock",
                        self.dir / "agent.lock",
                        timeout=timeout,
                        alive=self.alive,
                    )
                except ChannelClosed:
                    if not self.alive():
                        self._crashed()
                    raise
            self._users += 1
        ch = self._ch
        try:
            yield ch
        except ChannelClosed:
            if not self.alive():
                self._crashed()
            raise
        finally:
            self._users -= 1
            if self._users == 0 and self._ch is ch:
                self._ch = None
                await ch.close()
