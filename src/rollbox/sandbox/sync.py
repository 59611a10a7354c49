"""The sync facade: :class:`Sandbox` and :class:`Files` mirror the async API with the same
names, running every call on one event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from rollbox.backends.base import OutputCallback
from rollbox.backends.common.copylinks import LinkPolicy
from rollbox.backends.isolation import IsolatedExec
from rollbox.config import Home
from rollbox.models import ExecResult, Limits, NetworkPolicy, SandboxInfo
from rollbox.sandbox.aio import AsyncFiles, AsyncSandbox

T = TypeVar("T")


CANCEL_WAIT_S = 120.0
"""How long a sync call interrupted by Ctrl-C waits for its cancellation to clean up."""


class _Loop:
    """One event loop in a daemon thread, shared by every sync ``Sandbox``."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T]) -> T:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="rollbox-loop", daemon=True).start()
                cls._loop = loop
        started, finished = threading.Event(), threading.Event()

        async def tracked() -> T:
            started.set()
            try:
                return await coro
            finally:
                finished.set()

        fut: Future[T] = asyncio.run_coroutine_threadsafe(tracked(), cls._loop)
        try:
            return fut.result()
        except KeyboardInterrupt:
            # Ctrl-C in the caller's thread: cancel the coroutine in the loop thread and let
            # its cancellation path finish (a create in flight is destroyed, an exec's
            # process tree killed) before the interrupt goes on. ``fut`` itself reports
            # cancelled at once, before the coroutine has unwound: wait for ``finished``.
            fut.cancel()
            deadline = time.monotonic() + CANCEL_WAIT_S
            while not finished.wait(0.05) and time.monotonic() < deadline:
                if not started.is_set() and time.monotonic() > deadline - CANCEL_WAIT_S + 1:
                    break  # cancelled before it began: nothing to unwind
            raise


class Files:
    """Sync mirror of :class:`AsyncFiles`."""

    def __init__(self, files: AsyncFiles) -> None:
        self._f = files

    def read(self, path: str) -> bytes:
        """Read a file inside the sandbox."""
        return _Loop.run(self._f.read(path))

    def read_text(self, path: str) -> str:
        """Read a UTF-8 text file inside the sandbox."""
        return _Loop.run(self._f.read_text(path))

    def write(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace a file inside the sandbox."""
        _Loop.run(self._f.write(path, data, mode=mode))

    def upload(self, src: Path | str, dest: str) -> None:
        """Copy a host file or directory into the sandbox."""
        _Loop.run(self._f.upload(src, dest))

    def download(self, src: str, dest: Path | str, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or directory out of the sandbox."""
        _Loop.run(self._f.download(src, dest, links=links))


class Sandbox:
    """Sync mirror of :class:`AsyncSandbox` (same names); leaving ``with`` destroys it."""

    def __init__(self, inner: AsyncSandbox) -> None:
        self._a = inner
        self.files = Files(inner.files)

    @classmethod
    def create(
        cls,
        baseline: str | None = None,
        *,
        backend: str = "namespace",
        limits: Limits | None = None,
        network: NetworkPolicy | str | None = None,
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        ttl: float | None = None,
        hostname: str = "sandbox",
        workdir: str | None = None,
        user: str | None = None,
        from_snapshot: str | None = None,
        home: Home | None = None,
    ) -> Sandbox:
        """Create and start a sandbox; arguments and errors as :meth:`AsyncSandbox.create`."""
        return cls(
            _Loop.run(
                AsyncSandbox.create(
                    baseline,
                    backend=backend,
                    limits=limits,
                    network=network,
                    env=env,
                    secrets=secrets,
                    labels=labels,
                    ttl=ttl,
                    hostname=hostname,
                    workdir=workdir,
                    user=user,
                    from_snapshot=from_snapshot,
                    home=home,
                )
            )
        )

    @classmethod
    def connect(
        cls, sandbox_id: str, *, secrets: dict[str, str] | None = None, home: Home | None = None
    ) -> Sandbox:
        """Attach to a live sandbox by id (created by this or any other process)."""
        return cls(_Loop.run(AsyncSandbox.connect(sandbox_id, secrets=secrets, home=home)))

    @property
    def id(self) -> str:
        """``sbx-<ulid>``."""
        return self._a.id

    @property
    def info(self) -> SandboxInfo:
        """The sandbox's state record."""
        return self._a.info

    async def to_async(self) -> AsyncSandbox:
        """An :class:`AsyncSandbox` on the same sandbox for the *calling* event loop (the
        sync facade's own one lives in another thread and must not be awaited from here).
        Destroying either destroys the sandbox."""
        return await AsyncSandbox.connect(
            self.id, secrets=self._a._secrets or None, home=self._a.backend.home
        )

    def exec(
        self,
        cmd: list[str] | str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        user: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        isolate: IsolatedExec | None = None,
    ) -> ExecResult:
        """Run a command; arguments and errors as :meth:`AsyncSandbox.exec`. Ctrl-C kills
        the command's process tree before ``KeyboardInterrupt`` reaches the caller."""
        return _Loop.run(
            self._a.exec(
                cmd,
                cwd=cwd,
                env=env,
                stdin=stdin,
                timeout=timeout,
                user=user,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                isolate=isolate,
            )
        )

    def snapshot(self, *, name: str | None = None) -> str:
        """The filesystem's current state as a new baseline; returns its digest."""
        return _Loop.run(self._a.snapshot(name=name))

    def snapshot_memory(self) -> str:
        """Memory + devices + disk as a restorable snapshot (``microvm``); returns its id."""
        return _Loop.run(self._a.snapshot_memory())

    def fork(self, n: int) -> list[Sandbox]:
        """``n`` independent sandboxes from the current state."""
        return [Sandbox(a) for a in _Loop.run(self._a.fork(n))]

    def pause(self) -> None:
        """Freeze every process inside."""
        _Loop.run(self._a.pause())

    def resume(self) -> None:
        """Thaw the sandbox."""
        _Loop.run(self._a.resume())

    def destroy(self) -> None:
        """Kill everything inside and remove every host resource (idempotent)."""
        _Loop.run(self._a.destroy())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()
