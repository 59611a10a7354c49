"""rollbox: fresh, isolated, restorable environments for parallel agent rollouts.

The public API is re-exported here; see the README for examples.
"""

from __future__ import annotations

__version__ = "0.1.0"

from rollbox.errors import (
    BackendError,
    CapabilityError,
    ExecTimeoutError,
    InvalidInputError,
    PathEscapeError,
    RollboxError,
    SandboxCrashedError,
)
from rollbox.models import ExecResult, Limits, NetworkPolicy, SandboxSpec
from rollbox.sandbox import AsyncSandbox, Sandbox

__all__ = [
    "AsyncSandbox",
    "BackendError",
    "CapabilityError",
    "ExecResult",
    "ExecTimeoutError",
    "InvalidInputError",
    "Limits",
    "NetworkPolicy",
    "PathEscapeError",
    "RollboxError",
    "Sandbox",
    "SandboxCrashedError",
    "SandboxSpec",
    "__version__",
]
