"""rollbox: fresh, isolated, restorable environments for parallel agent rollouts.

The public API is re-exported here; see the README for examples. Backend authors: see
:mod:`rollbox.backends.base` (the contract), :mod:`rollbox.backends.registry` (entry-point
group ``rollbox.backends``) and :mod:`rollbox.backends.config` (typed tuning).
"""

from __future__ import annotations

__version__ = "0.1.0"

from rollbox.errors import (
    BackendError,
    BackendUnavailableError,
    CapabilityError,
    ExecTimeoutError,
    InvalidInputError,
    IsADirectoryInSandboxError,
    NotFoundError,
    PathEscapeError,
    RollboxError,
    SandboxCrashedError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxStateError,
    UnsupportedOperationError,
)
from rollbox.models import ExecResult, Limits, NetworkPolicy, SandboxSpec
from rollbox.sandbox import AsyncSandbox, Sandbox

__all__ = [
    "AsyncSandbox",
    "BackendError",
    "BackendUnavailableError",
    "CapabilityError",
    "ExecResult",
    "ExecTimeoutError",
    "InvalidInputError",
    "IsADirectoryInSandboxError",
    "Limits",
    "NetworkPolicy",
    "NotFoundError",
    "PathEscapeError",
    "RollboxError",
    "Sandbox",
    "SandboxCrashedError",
    "SandboxFileNotFoundError",
    "SandboxNotFoundError",
    "SandboxSpec",
    "SandboxStateError",
    "UnsupportedOperationError",
    "__version__",
]
