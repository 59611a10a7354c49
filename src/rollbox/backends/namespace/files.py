"""Moved to :mod:`rollbox.backends.common.rootfiles` (shared by namespace and gvisor)."""

from rollbox.backends.common.paths import normalize
from rollbox.backends.common.rootfiles import (
    RESOLVE_BENEATH,
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    RootFiles,
    openat2,
)

__all__ = [
    "RESOLVE_BENEATH",
    "RESOLVE_IN_ROOT",
    "RESOLVE_NO_MAGICLINKS",
    "RootFiles",
    "normalize",
    "openat2",
]
