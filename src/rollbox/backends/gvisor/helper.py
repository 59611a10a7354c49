"""Compile the gVisor helpers once per source hash into ``$ROLLBOX_HOME/bin``:
``uds_listen.c`` (the socket helper started as gVisor's first process) and ``statx_fix.c``
(an LD_PRELOAD shim working around gVisor's statx gap)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

SOURCE = Path(__file__).with_name("uds_listen.c")
STATX_SOURCE = Path(__file__).with_name("statx_fix.c")


def helper_binary(home: Home) -> Path:
    """The compiled socket helper, built with ``gcc -static`` if missing.

    Raises:
        BackendUnavailableError: gcc or the static C library is missing, or compiling failed.
    """
    return _build(home, SOURCE, "rollbox-uds-listen", ["-static", "-O2", "-Wall"])


def statx_shim(home: Home) -> Path:
    """The compiled ``statx`` LD_PRELOAD shim (shared object), built if missing."""
    return _build(home, STATX_SOURCE, "rollbox-statx", ["-shared", "-fPIC", "-O2", "-Wall"])


def _build(home: Home, source: Path, name: str, flags: list[str]) -> Path:
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:8]
    suffix = ".so" if "-shared" in flags else ""
    target = home.root / "bin" / f"{name}-{digest}{suffix}"
    if target.exists():
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BackendUnavailableError(
            "gcc is needed to build the gVisor socket helper", hint="apt-get install gcc libc6-dev"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    proc = subprocess.run(
        [gcc, *flags, "-o", str(tmp), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BackendUnavailableError(
            f"building the gVisor helper {name} failed: {proc.stderr.strip()[-500:]}",
            hint="apt-get install gcc libc6-dev",
        )
    os.replace(tmp, target)
    return target
