"""The async sandbox API: :class:`AsyncSandbox` and its :class:`AsyncFiles`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from rollbox.backends.base import Backend, Operation, OutputCallback, SandboxHandle
from rollbox.backends.common.copylinks import LinkPolicy
from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.registry import get_backend
from rollbox.config import Home
from rollbox.errors import InvalidInputError, RollboxError
from rollbox.models import (
    ExecResult,
    Limits,
    NetworkPolicy,
    SandboxInfo,
    SandboxSpec,
)
from rollbox.sandbox.lifecycle import create_handle, finish_or_dispose, read_state


@contextlib.contextmanager
def _on_sandbox(sandbox_id: str, backend: str | None) -> Iterator[None]:
    """Tag a RollboxError raised inside with the sandbox it happened on (httpx-style)."""
    try:
        yield
    except RollboxError as exc:
        exc.on_sandbox(sandbox_id, backend)
        raise


class AsyncFiles:
    """File operations on a sandbox; every path is resolved inside the sandbox root.

    Errors: :class:`~rollbox.errors.SandboxFileNotFoundError` (also a
    ``FileNotFoundError``), :class:`~rollbox.errors.IsADirectoryInSandboxError` (also an
    ``IsADirectoryError``), :class:`~rollbox.errors.PathEscapeError` (also a
    ``PermissionError``).
    """

    def __init__(
        self,
        handle: SandboxHandle,
        backend: str | None = None,
        guard: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self._h = handle
        self._backend = backend
        self._guard = guard

    def _tag(self) -> contextlib.AbstractContextManager[None]:
        if self._guard is not None:  # the owning sandbox's: same loop, errors tagged
            return self._guard()
        return _on_sandbox(self._h.id, self._backend)

    async def read(self, path: str) -> bytes:
        """Read a file inside the sandbox."""
        with self._tag():
            return await self._h.read_file(path)

    async def read_text(self, path: str) -> str:
        """Read a UTF-8 text file inside the sandbox."""
        return (await self.read(path)).decode()

    async def write(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace a file inside the sandbox."""
        with self._tag():
            await self._h.write_file(path, data, mode=mode)

    async def upload(self, src: Path | str, dest: str) -> None:
        """Copy a host file or directory into the sandbox."""
        with self._tag():
            await self._h.upload(Path(src), dest)

    async def download(self, src: str, dest: Path | str, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or directory out of the sandbox to the host; ``links``: what a tree
        download does with a link pointing out of the tree (``refuse`` or ``content``)."""
        with self._tag():
            await self._h.download(src, Path(dest), links=links)


class AsyncSandbox:
    """One isolated, disposable environment (async API). Leaving ``async with`` destroys it."""

    def __init__(
        self, handle: SandboxHandle, backend: Backend, secrets: dict[str, str] | None = None
    ) -> None:
        self._handle = handle
        self.backend = backend
        self._secrets = dict(secrets or {})
        self.files = AsyncFiles(handle, backend.name, self._op)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # made outside a loop: bound to the first one that uses it

    @contextlib.contextmanager
    def _op(self, operation: Operation | None = None) -> Iterator[None]:
        """Around every operation: same event loop, capability checked, errors tagged."""
        with _on_sandbox(self._handle.id, self.backend.name):
            loop = asyncio.get_running_loop()
            if self._loop is None or self._loop.is_closed():
                self._loop = loop  # first use, or its loop ended (asyncio.run after asyncio.run)
            elif loop is not self._loop:
                raise InvalidInputError(
                    f"sandbox {self.id} belongs to another event loop",
                    hint="use `await AsyncSandbox.connect(id)` (or `await sbx.to_async()` for "
                    "a sync Sandbox) in this loop",
                )
            if operation is not None:
                self.backend.require(operation)
            yield

    @classmethod
    async def create(
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
    ) -> AsyncSandbox:
        """Create and start a sandbox.

        Args:
            baseline: digest, unique digest prefix or name; ``None`` for the default
                Debian baseline (bootstrapped on first use).
            backend: ``namespace``, ``gvisor`` or ``microvm``.
            limits: resource limits (defaults: 1 cpu, 512 MiB, 256 pids, 1 GiB disk).
            network: a policy, or ``"none"`` / ``"loopback"`` / ``"allow=HOST:PORT,..."``.
            env: environment variables of every exec.
            secrets: like ``env`` but kept only in memory and masked in output.
            labels: free-form labels.
            ttl: seconds until the sandbox is destroyed, even if this process dies.
            hostname: hostname inside.
            workdir: default working directory.
            user: default user inside.
            from_snapshot: memory snapshot id to restore from (microvm).
            home: data home (default ``ROLLBOX_HOME``).

        Raises:
            UnknownBackendError, BaselineNotFoundError, CapabilityError, LimitsError:
                invalid requests, refused before anything starts.
            BackendError: the sandbox could not be started (nothing is left behind).
        """
        from rollbox.baselines.store import BaselineStore

        home = (home or Home.from_env()).ensure()
        be = get_backend(backend, home)
        store = BaselineStore(home)
        info = store.default() if baseline is None else store.resolve(baseline)
        spec = SandboxSpec(
            baseline=info.digest,
            backend=backend,
            limits=limits or Limits(),
            network=parse_network(network),
            env=env or {},
            labels=labels or {},
            ttl_s=ttl,
            hostname=hostname,
            workdir=workdir,
            user=user,
            from_snapshot=from_snapshot,
        )
        be.check(spec)
        be.prepare()
        handle = await create_handle(be, spec, info)
        return cls(handle, be, secrets)

    @classmethod
    async def connect(
        cls, sandbox_id: str, *, secrets: dict[str, str] | None = None, home: Home | None = None
    ) -> AsyncSandbox:
        """Attach to a live sandbox by id (created by this or any other process)."""
        home = home or Home.from_env()
        with _on_sandbox(sandbox_id, None):
            state = read_state(home, sandbox_id)
        be = get_backend(state.backend, home)
        with _on_sandbox(sandbox_id, state.backend):
            return cls(await be.attach(sandbox_id), be, secrets)

    @property
    def id(self) -> str:
        """``sbx-<ulid>``."""
        return self._handle.id

    @property
    def info(self) -> SandboxInfo:
        """The sandbox's state record."""
        return self._handle.info

    @property
    def handle(self) -> SandboxHandle:
        """The backend-level handle (for backends' own extras)."""
        return self._handle

    async def exec(
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
        """Run a command; see :meth:`SandboxHandle.exec`. A non-zero exit is a result,
        not an exception.

        Raises:
            asyncio.CancelledError: the caller was cancelled (the command's process tree
                is killed), also when the cancellation raced with the command's end.
            UnsupportedOperationError: ``user`` names a non-root user and the backend
                cannot run commands as one (capability ``users``).
        """
        task = asyncio.current_task()
        pending = task.cancelling() if task is not None else 0
        with self._op("users" if user not in (None, "root", "0", "0:0") else None):
            result = await self._exec(
                cmd, cwd, env, stdin, timeout, user, on_stdout, on_stderr, isolate
            )
        if task is not None and task.cancelling() > pending:
            # Python 3.11's wait_for returns a result that raced with a cancellation and
            # drops the cancellation; the caller must still see it.
            raise asyncio.CancelledError
        return result

    async def _exec(
        self,
        cmd: list[str] | str,
        cwd: str | None,
        env: dict[str, str] | None,
        stdin: bytes | str | None,
        timeout: float | None,
        user: str | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        isolate: IsolatedExec | None,
    ) -> ExecResult:
        # Passed only when set: handles without the parameter (test doubles) keep working.
        extra: dict[str, IsolatedExec] = {} if isolate is None else {"isolate": isolate}
        return await self._handle.exec(
            cmd,
            cwd=cwd,
            env=env,
            secrets=self._secrets or None,
            stdin=stdin,
            timeout=timeout,
            user=user,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            **extra,
        )

    async def snapshot(self, *, name: str | None = None) -> str:
        """The filesystem's current state as a new baseline; the sandbox keeps running.
        See :meth:`SandboxHandle.snapshot`.

        Returns:
            The new baseline's digest.
        """
        with self._op("snapshot"):
            return await self._handle.snapshot(name=name)

    async def snapshot_memory(self) -> str:
        """Memory + devices + disk as a restorable snapshot (``microvm``); keeps running.
        See :meth:`SandboxHandle.snapshot_memory`.

        Returns:
            The snapshot's id (``snap-...``) for ``create(from_snapshot=...)``.

        Raises:
            UnsupportedOperationError: the backend has no memory snapshots.
        """
        with self._op("memory_snapshot"):
            return await self._handle.snapshot_memory()

    async def fork(self, n: int) -> list[AsyncSandbox]:
        """``n`` independent sandboxes from the current state (they inherit the secrets):
        filesystem only on ``namespace``/``gvisor``, memory + processes on ``microvm``
        (see :meth:`SandboxHandle.fork`)."""

        async def dispose(handles: list[SandboxHandle]) -> None:
            for h in handles:
                await h.destroy()

        with self._op("fork"):
            handles = await finish_or_dispose(self._handle.fork(n), dispose, "forked sandboxes")
        return [AsyncSandbox(h, self.backend, self._secrets) for h in handles]

    async def pause(self) -> None:
        """Freeze every process inside."""
        with self._op("pause"):
            await self._handle.pause()

    async def resume(self) -> None:
        """Thaw the sandbox."""
        with self._op("pause"):
            await self._handle.resume()

    async def destroy(self) -> None:
        """Kill everything inside and remove every host resource (idempotent)."""
        with self._op():
            await self._handle.destroy()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.destroy())


def parse_network(value: NetworkPolicy | str | None) -> NetworkPolicy:
    """``None``/``"none"``, ``"loopback"`` or ``"allow=H:P,H:P"`` to a policy.

    Raises:
        InvalidInputError: the string is not one of those forms.
    """
    from rollbox.errors import InvalidInputError
    from rollbox.models import HostPort

    if value is None:
        return NetworkPolicy()
    if isinstance(value, NetworkPolicy):
        return value
    if value in ("none", "loopback"):
        return NetworkPolicy(mode=value)  # type: ignore[arg-type]
    if value.startswith("allow="):
        try:
            allow = [HostPort.parse(x) for x in value[len("allow=") :].split(",") if x]
        except ValueError as exc:
            raise InvalidInputError(f"bad network policy {value!r}: {exc}") from None
        if not allow:
            raise InvalidInputError("network 'allow=' needs at least one HOST:PORT")
        return NetworkPolicy(mode="allow", allow=allow)
    raise InvalidInputError(
        f"bad network policy {value!r}", hint="use none, loopback or allow=HOST:PORT,..."
    )
