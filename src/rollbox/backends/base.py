"""The backend contract every isolation backend implements.

Two lifecycle levels (as in inspect_ai's task_init/cli_cleanup and SWE-ReX's
deployment/runtime split):

* backend-wide: :meth:`Backend.prepare` (check tools, build shared assets) and
  :meth:`Backend.cleanup_orphans` (remove what sandboxes of dead owners left behind);
* per sandbox: :meth:`Backend.create` / :meth:`Backend.attach` and :meth:`SandboxHandle.destroy`.

A sandbox must be re-attachable by id from another process (the CLI creates a sandbox in
one process and execs in it from the next), so its state lives in
``$ROLLBOX_HOME/sandboxes/<id>/state.json`` (a :class:`~rollbox.models.SandboxInfo`) and
in host resources named after the id and the home's tag.

All I/O methods are ``async``; :mod:`rollbox.sandbox` offers the public async API and a
sync facade with the same names.

Operations differ by backend only where :class:`~rollbox.models.Capabilities` says so;
callers check :meth:`Backend.require` first and an operation a backend lacks raises
:class:`~rollbox.errors.UnsupportedOperationError` (naming backend and operation):

============== ====================================== ======================================
operation      ``namespace`` / ``gvisor``             ``microvm``
============== ====================================== ======================================
``snapshot``   filesystem changes -> new baseline     same (the guest's filesystem diff)
``fork``       filesystem only: copies of the upper   memory + processes: running copies
               layer, each starting with no process   restored from one memory snapshot
``snapshot_``  unsupported                            RAM + devices + frozen disk ->
``memory``                                            ``snap-...`` (``from_snapshot``)
``pause``      cgroup freezer                         QMP ``stop`` / ``cont``
============== ====================================== ======================================
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from rollbox.backends.common.copylinks import LinkPolicy
from rollbox.backends.isolation import IsolatedExec
from rollbox.config import Home
from rollbox.errors import UnsupportedOperationError
from rollbox.models import BaselineInfo, Capabilities, ExecResult, SandboxInfo, SandboxSpec

if TYPE_CHECKING:
    from rollbox.backends.config import BackendConfig

Operation = Literal["snapshot", "memory_snapshot", "fork", "pause", "users"]
"""An optional operation, named as its flag in :class:`~rollbox.models.Capabilities`."""

OutputCallback = Callable[[str], None]
"""Receives decoded chunks of a command's stdout or stderr as they arrive."""


def command_argv(cmd: list[str] | str) -> list[str]:
    """The argv of an exec: a string runs with ``/bin/sh -c``, a list as it is.

    Raises:
        InvalidInputError: the command is empty.
    """
    from rollbox.errors import InvalidInputError

    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise InvalidInputError("empty command")
    return argv


class SandboxHandle(abc.ABC):
    """One live sandbox, as seen by its backend."""

    @property
    @abc.abstractmethod
    def info(self) -> SandboxInfo:
        """The sandbox's current state record."""

    @property
    def id(self) -> str:
        """The sandbox id, ``sbx-<ulid>``."""
        return self.info.id

    @abc.abstractmethod
    async def exec(
        self,
        cmd: list[str] | str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        user: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        isolate: IsolatedExec | None = None,
    ) -> ExecResult:
        """Run a command inside the sandbox and wait for it.

        Args:
            cmd: argv list, or a string run with ``/bin/sh -c``.
            cwd: working directory inside (default: the sandbox's workdir).
            env: extra environment variables for this command.
            secrets: like ``env`` but never written to disk, store or logs; values are
                masked (``***``) in any captured output.
            stdin: bytes fed to the command's stdin (then closed).
            timeout: seconds; on expiry the whole process tree started by this command
                (``setsid`` daemons included) is killed and ``ExecTimeoutError`` raised.
            user: ``root`` or a uid[:gid]/name inside (default: the sandbox's user).
            on_stdout: called with each decoded stdout chunk as it arrives.
            on_stderr: called with each decoded stderr chunk as it arrives.
            isolate: run the command in its own mount namespace with fresh directories
                filled from the host, collect files back, and/or kill every other process
                first (see :class:`~rollbox.backends.isolation.IsolatedExec`); its output
                fields are filled in.

        Returns:
            The exit code, capped stdout/stderr, duration and OOM flag.

        Raises:
            ExecTimeoutError: the command ran past ``timeout``.
            SandboxStateError: the sandbox is destroyed or paused.
            SandboxCrashedError: the sandbox's runtime died.
            CapabilityError: the backend cannot isolate an exec as ``isolate`` asks.
        """

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a file inside the sandbox.

        Raises:
            PathEscapeError: ``path`` resolves outside the sandbox root.
            NotFoundError: there is no such file.
        """

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write (create or replace) a file inside the sandbox, making parent directories.

        Raises:
            PathEscapeError: ``path`` resolves outside the sandbox root.
        """

    @abc.abstractmethod
    async def upload(self, src: Path, dest: str) -> None:
        """Copy a host file or directory tree to ``dest`` inside the sandbox.

        Raises:
            PathEscapeError: ``dest`` resolves outside the sandbox root.
        """

    @abc.abstractmethod
    async def download(self, src: str, dest: Path, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or directory tree from inside the sandbox to the host path ``dest``.

        The contract of :mod:`rollbox.backends.common.copylinks`: ``src`` resolves with
        chroot semantics (a link to a file inside is followed inside); in a tree, links
        into the tree stay links (written relative, so no host link ever points out of
        ``dest``) and links out of it are refused or replaced by their content.

        Args:
            src: Path inside the sandbox.
            dest: Host path.
            links: ``"refuse"`` or ``"content"``: links pointing out of a copied tree.

        Raises:
            PathEscapeError: ``src`` climbs above ``/``, or a link points out of the
                copied tree with ``links="refuse"``.
        """

    @abc.abstractmethod
    async def snapshot(self, *, name: str | None = None) -> str:
        """Capture the sandbox's filesystem while it keeps running (capability ``snapshot``).

        On every backend this is the filesystem only: the changes since the baseline become
        a new top layer of a new baseline (processes and memory are not captured; see
        :meth:`snapshot_memory` for that).

        Args:
            name: optional name/tag for the new baseline.

        Returns:
            The new baseline's digest (``sha256:...``; its parent is recorded).

        Raises:
            SandboxStateError: the sandbox is destroyed.
        """

    async def snapshot_memory(self) -> str:
        """Capture memory, devices and disk while the sandbox keeps running (capability
        ``memory_snapshot``: ``microvm`` only).

        Returns:
            The memory snapshot's id (``snap-...``), restorable with
            ``SandboxSpec.from_snapshot`` (processes resume where they were).

        Raises:
            UnsupportedOperationError: the backend has no memory snapshots (``namespace``,
                ``gvisor``: their ``runsc checkpoint`` hangs here).
        """
        raise UnsupportedOperationError(
            self.info.backend, "memory_snapshot", hint="use backend microvm"
        )

    @abc.abstractmethod
    async def fork(self, n: int) -> list[SandboxHandle]:
        """Make ``n`` new sandboxes from this one's current state, independent of each other
        and of this one (capability ``fork``).

        What "state" means depends on the backend: on ``namespace`` and ``gvisor`` it is
        the filesystem only (each fork gets a copy of the writable layer and starts with no
        process running); on ``microvm`` it is memory + processes + disk (each fork is a
        running copy restored from one memory snapshot, processes included).

        Raises:
            InvalidInputError: ``n < 1``.
            SandboxStateError: the sandbox is destroyed.
        """

    @abc.abstractmethod
    async def pause(self) -> None:
        """Freeze every process inside (no CPU time) until :meth:`resume` (capability
        ``pause``)."""

    @abc.abstractmethod
    async def resume(self) -> None:
        """Thaw a paused sandbox."""

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Kill everything inside and remove every host resource the sandbox made.

        Idempotent: destroying a destroyed sandbox does nothing.
        """


class Backend(abc.ABC):
    """An isolation backend. Instances are cheap; one per (backend, home).

    Register a subclass with :func:`rollbox.backends.registry.register_backend` (or the
    ``rollbox.backends`` entry-point group) to make it available by name.
    """

    name: ClassVar[str]
    """Registry name: ``namespace``, ``gvisor``, ``microvm``."""
    capabilities: ClassVar[Capabilities]
    """What sandboxes of this backend can do."""

    def __init__(
        self, home: Home, *, detached: bool = False, config: BackendConfig | None = None
    ) -> None:
        """Make an instance (cheap: tools are checked by :meth:`prepare`).

        Args:
            home: the data home.
            detached: sandboxes created (and forked) through this instance have no owner
                process: they outlive it until destroyed or their TTL (CLI ``sandbox
                create``).
            config: this backend's tuning (:mod:`rollbox.backends.config`); default: its
                defaults with the ``ROLLBOX_*`` environment overrides applied.
        """
        self.home = home
        self.detach = detached
        """When True, created sandboxes have no owner process (see ``detached``)."""
        self._config = config
        self._resolved: BackendConfig | None = None

    @property
    def config(self) -> BackendConfig:
        """This backend's tuning (environment overrides applied)."""
        if self._resolved is None:
            from rollbox.backends.config import config_for

            self._resolved = config_for(self.name, self._config)
        return self._resolved

    def reconfigure(self, config: BackendConfig) -> None:
        """Replace this instance's tuning for the sandboxes it creates from now on (the
        environment overrides still apply).

        Raises:
            InvalidInputError: ``config`` is for another backend.
        """
        from rollbox.backends.config import config_for

        self._resolved = config_for(self.name, config)
        self._config = config

    def require(self, operation: Operation) -> None:
        """Check that this backend offers ``operation`` before using it.

        Raises:
            UnsupportedOperationError: it does not (naming the backend and the operation).
        """
        if not getattr(self.capabilities, operation):
            hint = "use backend microvm" if operation == "memory_snapshot" else None
            raise UnsupportedOperationError(self.name, operation, hint=hint)

    @abc.abstractmethod
    def version(self) -> str:
        """Name and version of the underlying tool, e.g. ``runc 1.1.5``."""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Check the host tools and build shared assets (idempotent, fast when done).

        Raises:
            BackendUnavailableError: a tool is missing or unusable; the message names the
                Debian package to install.
        """

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec, baseline: BaselineInfo) -> SandboxHandle:
        """Create and start a sandbox from ``baseline`` (already resolved and checked).

        Raises:
            CapabilityError: the spec asks for something this backend cannot do.
            LimitsError: the limits cannot be met.
            BackendError: the sandbox could not be started; nothing is left behind.
        """

    @abc.abstractmethod
    async def attach(self, sandbox_id: str) -> SandboxHandle:
        """Re-attach to a live sandbox created by any process.

        Raises:
            SandboxNotFoundError: no such live sandbox in this home.
        """

    @abc.abstractmethod
    def destroy_by_id(self, sandbox_id: str) -> list[str]:
        """Destroy a sandbox of this backend in this home by id, live or not, without
        attaching to it (idempotent; what ``rollbox sandbox rm`` and the TTL reaper use).

        Returns:
            One human-readable line per removed resource (empty when nothing was left).

        Raises:
            TeardownError: something could not be removed (every other step still ran).
        """

    @abc.abstractmethod
    def list_sandboxes(self) -> list[SandboxInfo]:
        """The sandboxes of this backend in this home (live ones and unreaped leftovers)."""

    @abc.abstractmethod
    def cleanup_orphans(self, *, dry_run: bool = False) -> list[str]:
        """Remove what sandboxes whose owner is gone (or whose TTL passed) left behind.

        Returns:
            One human-readable line per removed (or, with ``dry_run``, removable) resource.
        """

    def check(self, spec: SandboxSpec) -> None:
        """Preflight: refuse a spec this backend cannot honour, before anything starts.

        Raises:
            CapabilityError: naming the missing capability and a backend that has it.
        """
        from rollbox.errors import CapabilityError

        caps = self.capabilities
        if spec.network.mode not in caps.network_modes:
            raise CapabilityError(
                f"backend {self.name!r} does not support network mode {spec.network.mode!r}",
                hint=f"supported: {', '.join(caps.network_modes)}",
            )
        if spec.from_snapshot and not caps.memory_snapshot:
            raise UnsupportedOperationError(
                self.name, "memory_snapshot", hint="use backend microvm"
            )
        if spec.user not in (None, "root", "0", "0:0") and not caps.users:
            raise UnsupportedOperationError(self.name, "users", hint="run as root")

    def hardware_virtualized(self) -> tuple[bool, str]:
        """Whether this backend's sandboxes run under hardware virtualisation on this host
        (``--backend auto`` prefers such a backend), and why. May run :meth:`prepare`.

        Returns:
            ``(False, reason)`` unless the backend overrides it (``microvm``: KVM usable).

        Raises:
            BackendUnavailableError: the backend cannot run here (from ``prepare``).
        """
        return False, f"backend {self.name!r} uses no hardware virtualisation"


class MemorySnapshotRecord(Protocol):
    """What a memory snapshot's record tells (microvm: ``MemorySnapshot``)."""

    @property
    def id(self) -> str:
        """``snap-<ulid>``."""

    @property
    def source(self) -> str:
        """The sandbox it was taken of."""

    @property
    def baseline(self) -> str:
        """Digest of the filesystem baseline under it."""

    @property
    def ephemeral(self) -> bool:
        """Made by ``fork()`` and removed once unused."""

    @property
    def layout(self) -> str:
        """How the memory is stored (backend-specific)."""

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        """The record as a dict (``mode="json"``: JSON-ready)."""


class MemorySnapshots(abc.ABC):
    """Capability interface of backends whose ``capabilities.memory_snapshot`` is set: the
    stored memory snapshots of a home. Test with ``isinstance(backend, MemorySnapshots)``
    or use :func:`memory_snapshots`."""

    @abc.abstractmethod
    def list_snapshots(self) -> Sequence[MemorySnapshotRecord]:
        """The memory snapshots of this home."""

    @abc.abstractmethod
    def load_snapshot(self, snap_id: str) -> MemorySnapshotRecord:
        """The record of ``snap_id``.

        Raises:
            InvalidInputError: not a snapshot id.
            NotFoundError: no such snapshot.
        """

    @abc.abstractmethod
    def remove_snapshot(self, snap_id: str) -> None:
        """Delete a memory snapshot.

        Raises:
            NotFoundError: no such snapshot.
            InUseError: a live sandbox or another snapshot depends on it.
        """


def memory_snapshots(backend: Backend) -> MemorySnapshots:
    """``backend`` as its memory-snapshot interface.

    Raises:
        UnsupportedOperationError: the backend has no memory snapshots.
    """
    backend.require("memory_snapshot")
    if not isinstance(backend, MemorySnapshots):  # declared but not implemented
        raise UnsupportedOperationError(backend.name, "memory_snapshot")
    return backend
