"""The one exception tree of rollbox.

Every error rollbox raises on purpose derives from :class:`RollboxError`. Each class
carries ``exit_code``: the CLI prints ``error: <message>`` as a single line and exits
with it (2 for input the user can fix, 1 for a failed operation). Some classes also
derive from a builtin so callers can catch them the usual way.

A backend failure (the sandbox could not do what was asked) is never confused with a
command's non-zero exit: the latter is an ``ExecResult`` with ``exit_code != 0``, not an
exception.

::

    RollboxError
    ├── InvalidInputError (ValueError)            exit 2: the user can fix it
    │   ├── InvalidDigestError
    │   ├── NotFoundError (LookupError)
    │   │   ├── BaselineNotFoundError
    │   │   ├── SandboxNotFoundError
    │   │   ├── SandboxFileNotFoundError (FileNotFoundError)   no such file inside
    │   │   ├── RunNotFoundError
    │   │   └── RolloutNotFoundError
    │   ├── RecipeError                           bad bootstrap recipe / build input
    │   ├── UnknownBaseImageError                 FROM names an image we cannot get
    │   ├── TaskError                             malformed Harbor task directory
    │   ├── UnknownBackendError
    │   ├── UnknownAgentError
    │   ├── CapabilityError                       backend cannot do what the request asks
    │   │   └── UnsupportedOperationError         an operation the backend lacks (.operation)
    │   ├── LimitsError                           limits that cannot be met
    │   ├── PathEscapeError (PermissionError)     sandbox path resolves outside the root
    │   ├── IsADirectoryInSandboxError (IsADirectoryError)   a file operation met a directory
    │   └── InUseError                            refused: a live sandbox uses it
    ├── BuildError                                exit 1: a build step failed (has .output)
    ├── StoreError                                exit 1
    │   └── CorruptionError                       a blob/layer hash does not match
    ├── BackendError                              exit 1: infrastructure, retryable
    │   ├── BackendUnavailableError               a tool is missing / does not work here
    │   ├── TeardownError                         destroy/cleanup left resources (.errors)
    │   ├── SandboxCrashedError                   the sandbox died under us (e.g. QEMU killed)
    │   │   └── SandboxExhaustedError             ...because a command exhausted a limit
    │   └── SandboxStateError                     e.g. exec on a destroyed/paused sandbox
    │       └── SandboxExpiredError               the sandbox reached its TTL
    ├── ExecTimeoutError (TimeoutError)           exit 124: the command ran out of time
    ├── VerifierError                             exit 1: no/invalid reward
    └── IntegrityError                            exit 1: provenance digest mismatch

Errors raised by an operation on a sandbox carry its id and backend (``sandbox_id``,
``backend``; ``None`` otherwise), as httpx errors carry their ``request``: the public API
(:mod:`rollbox.sandbox`) fills them in on the way out.
"""

from __future__ import annotations


class RollboxError(Exception):
    """Root of every error rollbox raises on purpose."""

    exit_code: int = 1
    sandbox_id: str | None = None
    """The sandbox the failed operation was on (``sbx-...``), when there was one."""
    backend: str | None = None
    """That sandbox's backend name, when there was one."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")

    def on_sandbox(self, sandbox_id: str, backend: str | None) -> None:
        """Record the sandbox (and its backend) the error happened on; an id already set
        (e.g. by the backend itself) is kept."""
        if self.sandbox_id is None:
            self.sandbox_id = sandbox_id
        if self.backend is None:
            self.backend = backend

    def one_line(self) -> str:
        """The message as one line, with the hint on how to fix it when there is one."""
        text = str(self).replace("\n", " ").strip()
        return text


class InvalidInputError(RollboxError, ValueError):
    """Input the user can fix: exit code 2."""

    exit_code = 2


class InvalidDigestError(InvalidInputError):
    """A string that should be a ``sha256:<64 hex>`` digest (or a unique prefix) is not."""


class NotFoundError(InvalidInputError, LookupError):
    """Something named by the user does not exist."""


class BaselineNotFoundError(NotFoundError):
    """No baseline with that digest or name is in the store."""


class SandboxNotFoundError(NotFoundError):
    """No sandbox with that id exists (or it was destroyed)."""


class SandboxFileNotFoundError(NotFoundError, FileNotFoundError):
    """No such file (or a path component is not a directory) inside the sandbox."""


class RunNotFoundError(NotFoundError):
    """No run with that id is in the metadata store."""


class RolloutNotFoundError(NotFoundError):
    """No rollout with that id is in the metadata store."""


class RecipeError(InvalidInputError):
    """A bootstrap recipe or build input is invalid (unknown field, missing file...)."""


class UnknownBaseImageError(InvalidInputError):
    """A Dockerfile ``FROM`` names an image that is neither in the store nor reachable."""


class TaskError(InvalidInputError):
    """A Harbor task directory is malformed."""


class UnknownBackendError(InvalidInputError):
    """No backend is registered under that name."""


class UnknownAgentError(InvalidInputError):
    """The agent spec does not name a known agent."""


class CapabilityError(InvalidInputError):
    """The backend lacks a capability that the request needs."""


class UnsupportedOperationError(CapabilityError):
    """The sandbox's backend does not offer this operation (see ``Backend.capabilities``);
    ``operation`` names it (``fork``, ``pause``, ``memory_snapshot``...), ``backend`` the
    backend. Raised before anything is done."""

    def __init__(self, backend: str, operation: str, *, hint: str | None = None) -> None:
        super().__init__(f"backend {backend!r} does not support {operation}", hint=hint)
        self.backend = backend
        self.operation = operation


class LimitsError(InvalidInputError):
    """Limits that are invalid or cannot be met on this host."""


class PathEscapeError(InvalidInputError, PermissionError):
    """A sandbox path resolves outside the sandbox root (``..`` or a symlink)."""


class IsADirectoryInSandboxError(InvalidInputError, IsADirectoryError):
    """A file operation inside the sandbox met a directory (e.g. reading one)."""


class InUseError(InvalidInputError):
    """Refused because a live sandbox uses the object (override with ``--force``)."""


class BuildError(RollboxError):
    """A build step failed; ``output`` holds the step's output."""

    def __init__(self, message: str, *, output: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.output = output


class StoreError(RollboxError):
    """The local store cannot complete an operation."""


class CorruptionError(StoreError):
    """A stored blob or unpacked layer no longer matches its recorded hash."""

    def __init__(self, message: str, *, paths: list[str] | None = None) -> None:
        super().__init__(message)
        self.paths = paths or []


class BackendError(RollboxError):
    """Infrastructure failure in a backend; a rollout hitting this is retryable."""

    reason: str | None = None
    """A sandbox limit behind the failure (``oom_killed``, ``pids_exhausted``, ``disk_full``,
    ``ttl_expired``; see ``models.LimitReason``): then it is not the infrastructure's fault."""


class BackendUnavailableError(BackendError):
    """A backend's tool is missing or does not work on this host."""

    exit_code = 2


class TeardownError(BackendError):
    """A destroy or cleanup could not remove everything; it went on with the rest.

    ``removed`` lists what it did remove, ``errors`` one line per resource left behind.
    """

    def __init__(
        self,
        message: str,
        *,
        errors: list[str],
        removed: list[str] | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.errors = errors
        self.removed = removed or []


class SandboxCrashedError(BackendError):
    """The sandbox died underneath the caller (its runtime or VM is gone)."""


class SandboxExhaustedError(SandboxCrashedError):
    """The sandbox died because something inside exhausted a limit (on gVisor the host
    cgroup's OOM killer or task limit ends the whole sandbox); ``reason`` names the limit."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason


class SandboxStateError(BackendError):
    """The sandbox is in a state that does not allow the operation."""


class SandboxExpiredError(SandboxStateError):
    """The sandbox reached its TTL and was destroyed (``reason`` is ``ttl_expired``)."""

    reason = "ttl_expired"


class ExecTimeoutError(RollboxError, TimeoutError):
    """A command ran past its timeout; its whole process tree was killed."""

    exit_code = 124

    def __init__(
        self,
        message: str,
        *,
        stdout: str = "",
        stderr: str = "",
        timeout: float | None = None,
        reasons: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr
        self.timeout = timeout
        self.reasons = list(reasons or [])
        """Limits the command ran into before it was killed (``pids_exhausted``...)."""


class VerifierError(RollboxError):
    """The verifier wrote no reward, an empty one or one that cannot be parsed."""


class IntegrityError(RollboxError):
    """A recomputed provenance digest does not match the recorded one."""
