"""Where things are in a gVisor sandbox and on the host (runsc's state directory), and
the host-side allowances for gVisor's own processes (see the gvisor backend's docstring)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rollbox.config import Home

MEMORY_OVERHEAD_MB = 160
"""Host memory allowed for the sentry, gofer and stubs on top of ``Limits.memory_mb``."""
PIDS_OVERHEAD = 512
"""Host tasks allowed for the sentry's and gofer's threads on top of the stubs' share."""
PIDS_PER_PROCESS = 8
"""Host tasks allowed per process inside. Under the ptrace platform every address space
has a stub process holding one thread per sentry OS thread that ever ran it: a 64-process
fork bomb inside took 7259 host tasks (this host's pid_max is 32768, shared by everyone).
The host pids limit is the backstop that keeps the host's pid space safe -- reaching it
kills the sentry (the sandbox is reported crashed); ``Limits.pids`` itself is enforced
inside as RLIMIT_NPROC."""
PIDS_HOST_CAP = 2048
"""Upper bound of the stubs' share of the host pids limit."""
AGENT_DIR = "/run/.rollbox"
SOCKET_IN_SANDBOX = "/run/rollbox/agent.sock"
HELPER = f"{AGENT_DIR}/uds-listen"
STATX_SHIM = f"{AGENT_DIR}/statx.so"
"""LD_PRELOADed into every exec: gVisor 20221219's statx() rejects AT_NO_AUTOMOUNT, which
breaks ``ls`` and ``stat`` of current coreutils (see ``statx_fix.c``)."""
START_TIMEOUT_S = 20.0


def runsc_root(home: Home) -> Path:
    """runsc's state directory for this home (``runsc --root``)."""
    return home.root / "runsc"


def runsc_state(home: Home, sandbox_id: str) -> dict[str, object] | None:
    """runsc's view of a container (``runsc state``), or ``None`` when unknown."""
    proc = subprocess.run(
        ["runsc", "--root", str(runsc_root(home)), "state", sandbox_id],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)
    return data if isinstance(data, dict) else None
