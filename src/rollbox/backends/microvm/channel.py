"""Host side of the guest agent channel: QEMU's virtio-serial chardev socket.

QEMU serves the port on a unix socket that any process may connect to, one client at a
time, so a sandbox is re-attachable from a new process (the CLI). Clients of different
processes are serialised with ``flock`` on ``agent.lock``; within a process one
connection is shared by concurrent requests (multiplexed by request id). On connect the
client sends ``hello`` with a random nonce and skips everything until the matching reply,
which resynchronises the stream after an earlier client died mid-frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from rollbox.backends.microvm.guest_agent import (
    CHUNK,
    T_DATA,
    T_EOF,
    T_JSON,
    Parser,
    frame,
    jframe,
)
from rollbox.errors import BackendError

Frame = tuple[int, bytes] | None
"""(type, payload) of one frame for a request; ``None`` when the channel closed."""


class ChannelClosed(BackendError):
    """The agent connection went away (the VM may have died)."""


class AgentChannel:
    """One connection to a guest agent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = Parser()
        self.queues: dict[int, asyncio.Queue[Frame]] = {}
        self.next_id = secrets.randbelow(1 << 30) + 1
        self.closed = False
        self.lock_fd = -1
        self.task: asyncio.Task[None] | None = None
        self.hello: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls, sock: Path, lock: Path, *, timeout: float, alive: Callable[[], bool]
    ) -> AgentChannel:
        """Connect (waiting for other processes' clients and for the guest to boot).

        Raises:
            ChannelClosed: the VM died, or the agent did not answer within ``timeout``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if loop.time() > deadline:
                        raise ChannelClosed("the sandbox's agent channel is busy") from None
                    await asyncio.sleep(0.005)
            while True:
                try:
                    reader, writer = await asyncio.open_unix_connection(str(sock), limit=1 << 22)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if not alive() or loop.time() > deadline:
                        raise ChannelClosed("the VM is not running") from None
                    await asyncio.sleep(0.01)
            ch = cls(reader, writer)
            ch.lock_fd = fd
            nonce = secrets.token_hex(8)
            writer.write(jframe({"id": 0, "op": "hello", "nonce": nonce}))
            await writer.drain()
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    await ch.close()
                    raise ChannelClosed("the guest agent did not answer in time")
                try:
                    data = await asyncio.wait_for(reader.read(CHUNK), min(remaining, 0.25))
                except TimeoutError:
                    if not alive():
                        await ch.close()
                        raise ChannelClosed("the VM died before its agent answered") from None
                    continue
                if not data:
                    await ch.close()
                    raise ChannelClosed("the VM closed the agent channel")
                for kind, _stream, payload in ch.parser.feed(data):
                    if kind == T_JSON:
                        msg = json.loads(payload)
                        if msg.get("nonce") == nonce:
                            ch.hello = msg
                if ch.hello:
                    break
            ch.task = asyncio.create_task(ch._read_loop())
            return ch
        except BaseException:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.reader.read(CHUNK * 4)
                if not data:
                    break
                for kind, stream, payload in self.parser.feed(data):
                    q = self.queues.get(stream)
                    if q is not None:
                        q.put_nowait((kind, payload))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed = True
            for q in self.queues.values():
                q.put_nowait(None)

    def new_id(self) -> int:
        """A fresh request id with its frame queue."""
        rid = self.next_id
        self.next_id += 1
        self.queues[rid] = asyncio.Queue()
        return rid

    async def send(self, data: bytes) -> None:
        """Write raw frames.

        Raises:
            ChannelClosed: the connection is gone.
        """
        if self.closed:
            raise ChannelClosed("the agent channel is closed")
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (OSError, RuntimeError) as exc:
            self.closed = True
            raise ChannelClosed(f"the agent channel broke: {exc}") from None

    async def send_data(self, rid: int, data: bytes) -> None:
        """Send ``data`` as ``T_DATA`` frames of stream ``rid``, then ``T_EOF``."""
        view = memoryview(data)
        for i in range(0, len(view), CHUNK):
            await self.send(frame(T_DATA, rid, bytes(view[i : i + CHUNK])))
        await self.send(frame(T_EOF, rid, b""))

    async def next_frame(self, rid: int) -> tuple[int, bytes]:
        """The next frame of request ``rid``.

        Raises:
            ChannelClosed: the connection closed first.
        """
        item = await self.queues[rid].get()
        if item is None:
            raise ChannelClosed("the agent channel closed")
        return item

    async def reply(self, rid: int, on_frame: Callable[[int, bytes], None] | None = None) -> Any:
        """Wait for the JSON reply of ``rid``, passing other frames to ``on_frame``."""
        while True:
            kind, payload = await self.next_frame(rid)
            if kind == T_JSON:
                self.queues.pop(rid, None)
                return json.loads(payload)
            if on_frame is not None:
                on_frame(kind, payload)

    async def call(self, op: str, **args: Any) -> Any:
        """A simple request/reply."""
        rid = self.new_id()
        await self.send(jframe({"id": rid, "op": op, **args}))
        return await self.reply(rid)

    async def close(self) -> None:
        """Close the connection and release the cross-process lock."""
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()
        if self.lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = -1


@contextlib.asynccontextmanager
async def session(
    sock: Path, lock: Path, *, timeout: float, alive: Callable[[], bool]
) -> AsyncIterator[AgentChannel]:
    """A connection for the duration of a block."""
    ch = await AgentChannel.connect(sock, lock, timeout=timeout, alive=alive)
    try:
        yield ch
    finally:
        await ch.close()
