"""Compile the gVisor helpers once per source hash into ``$ROLLBOX_HOME/bin``:
``uds_listen.c`` (the socket helper started as gVisor's first process) and ``statx_fix.c``
(an LD_PRELOAD shim working around gVisor's statx gap)."""

from __future__ import annotations

from pathlib import Path

from rollbox.backends.agent.build import compile_c
from rollbox.config import Home

SOURCE = Path(__file__).with_name("uds_listen.c")
STATX_SOURCE = Path(__file__).with_name("statx_fix.c")


def helper_binary(home: Home) -> Path:
    """The compiled socket helper, built with ``gcc -static`` if missing.

    Raises:
        BackendUnavailableError: gcc or the static C library is missing, or compiling failed.
    """
    return compile_c(home, SOURCE, "rollbox-uds-listen", ["-static", "-O2", "-Wall"])


def statx_shim(home: Home) -> Path:
    """The compiled ``statx`` LD_PRELOAD shim (shared object), built if missing."""
    return compile_c(home, STATX_SOURCE, "rollbox-statx", ["-shared", "-fPIC", "-O2", "-Wall"])
