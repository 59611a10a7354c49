"""Host side of the agent protocol: one unix-socket connection per exec."""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_mod
import os
import socket
import struct
from array import array
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rollbox.backends.agent import protocol as p
from rollbox.backends.agent.protocol import ExecRequest
from rollbox.errors import SandboxCrashedError, SandboxStateError

__all__ = ["AgentClient", "AgentExit", "ExecRequest"]

ByteSink = Callable[[bytes], None]


@dataclass
class AgentExit:
    """How a command ended, as the agent saw it."""

    exit_code: int
    """Exit status, ``128+N`` when killed by signal N."""
    fail_stage: str | None = None
    """``chdir``, ``user`` or ``exec`` when the command could not be started."""
    fail_errno: int = 0
    """The errno of that failure."""

    def fail_message(self) -> str:
        """Human-readable reason the command did not start (empty if it did)."""
        if self.fail_stage is None:
            return ""
        return f"{self.fail_stage}: {os.strerror(self.fail_errno)}"

    @property
    def fail_errno_name(self) -> str:
        """Symbolic errno, e.g. ``ENOENT``."""
        return errno_mod.errorcode.get(self.fail_errno, str(self.fail_errno))


class AgentClient:
    """Talks to one sandbox's agent over ``socket_path``."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            with short_unix_path(self.socket_path) as path:
                return await asyncio.open_unix_connection(path, limit=1 << 20)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            raise SandboxCrashedError(
                f"the sandbox agent at {self.socket_path} is not reachable: {exc.strerror}"
            ) from None

    async def ping(self, timeout: float = 2.0) -> bool:
        """True when the agent answers within ``timeout`` seconds."""
        try:
            reader, writer = await asyncio.wait_for(self._connect(), timeout)
        except (SandboxCrashedError, TimeoutError, OSError):
            return False
        try:
            writer.write(p.frame(p.PING))
            kind, _ = await asyncio.wait_for(_read_frame(reader), timeout)
            return kind == p.PONG
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            return False
        finally:
            writer.close()

    async def _connect_with_fds(
        self, first: bytes, fds: list[int]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect and send ``first`` with ``fds`` attached (SCM_RIGHTS)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with short_unix_path(self.socket_path) as path:
                sock.connect(path)
            sent = sock.sendmsg([first], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
            if sent < len(first):
                sock.sendall(first[sent:])
            sock.setblocking(False)
            return await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            sock.close()
            raise SandboxCrashedError(
                f"the sandbox agent at {self.socket_path} is not reachable: {exc.strerror}"
            ) from None
        except BaseException:
            sock.close()
            raise

    async def exec(
        self,
        req: ExecRequest,
        *,
        on_pid: Callable[[int], Awaitable[None]] | None = None,
        cgroup_fds: list[int] | None = None,
        on_stdout: ByteSink,
        on_stderr: ByteSink,
    ) -> AgentExit:
        """Run ``req``. The command is placed in its own cgroups before it starts, in one of
        two ways: ``cgroup_fds`` (open ``cgroup.procs`` files; the command joins them itself,
        no extra round trip), or ``on_pid``, called with the command's pid inside the
        sandbox's pid namespace while the command waits for the go-ahead.

        Raises:
            SandboxCrashedError: the agent is unreachable or the connection broke.
        """
        if cgroup_fds:
            reader, writer = await self._connect_with_fds(
                p.encode_exec(req, cgroup_fds=True), cgroup_fds
            )
        else:
            reader, writer = await self._connect()
            writer.write(p.encode_exec(req))
        try:
            if cgroup_fds:
                await self._send_stdin(writer, req)
                return await self._collect(reader, on_stdout, on_stderr, req)
            kind, payload = await _read_frame(reader)
            if kind == p.FAIL:
                err = struct.unpack("<i", payload[1:5])[0]
                raise SandboxStateError(
                    f"the sandbox cannot start a process: {os.strerror(err)}",
                    hint="its pids or memory limit is exhausted",
                )
            if kind != p.PID:
                raise SandboxCrashedError(f"sandbox agent answered {kind!r} instead of a pid")
            if on_pid is not None:
                await on_pid(struct.unpack("<I", payload)[0])
            writer.write(p.frame(p.GO))
            await self._send_stdin(writer, req)
            return await self._collect(reader, on_stdout, on_stderr, req)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
            raise SandboxCrashedError(
                "the sandbox agent connection broke (sandbox died?)"
            ) from None
        finally:
            writer.close()

    @staticmethod
    async def _send_stdin(writer: asyncio.StreamWriter, req: ExecRequest) -> None:
        if req.stdin is None:
            return
        data = req.stdin
        out = [p.frame(p.STDIN, data[i : i + (1 << 16)]) for i in range(0, len(data), 1 << 16)]
        out.append(p.frame(p.STDIN))
        writer.write(b"".join(out))

    @staticmethod
    async def _collect(
        reader: asyncio.StreamReader, on_stdout: ByteSink, on_stderr: ByteSink, req: ExecRequest
    ) -> AgentExit:
        fail_stage: str | None = None
        fail_errno = 0
        while True:
            kind, payload = await _read_frame(reader)
            if kind == p.STDOUT:
                on_stdout(payload)
            elif kind == p.STDERR:
                on_stderr(payload)
            elif kind == p.FAIL:
                stage = p.FAIL_STAGES.get(payload[:1], "exec")
                fail_errno = struct.unpack("<i", payload[1:5])[0]
                if stage == "session":
                    raise SandboxStateError(
                        f"the sandbox cannot start a process: {os.strerror(fail_errno)}",
                        hint="its pids or memory limit is exhausted",
                    )
                fail_stage = stage
            elif kind == p.COLLECTED and req.isolate is not None:
                rel, _mode, full, data = p.decode_collected(payload)
                req.isolate.add_collected(rel, data, full)
            elif kind == p.TIMED_OUT and req.isolate is not None:
                req.isolate.timed_out = True
            elif kind == p.EXIT:
                code = struct.unpack("<i", payload)[0]
                return AgentExit(code, fail_stage, fail_errno)


@contextlib.contextmanager
def short_unix_path(path: Path) -> Iterator[str]:
    """``path`` usable for ``bind``/``connect`` even when longer than the 108-byte
    ``sun_path`` limit (through ``/proc/self/fd/N`` of its directory)."""
    text = str(path)
    if len(text) < 100:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    header = await reader.readexactly(p.HEADER.size)
    kind, length = p.HEADER.unpack(header)
    payload = await reader.readexactly(length) if length else b""
    return kind, payload
