"""Compile ``uds_listen.c`` (the socket helper started as gVisor's first process) once per
source hash into ``$ROLLBOX_HOME/bin``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

SOURCE = Path(__file__).with_name("uds_listen.c")


def helper_binary(home: Home) -> Path:
    """The compiled helper, built with ``gcc -static`` if missing.

    Raises:
        BackendUnavailableError: gcc or the static C library is missing, or compiling failed.
    """
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:8]
    target = home.root / "bin" / f"rollbox-uds-listen-{digest}"
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
        [gcc, "-static", "-O2", "-Wall", "-o", str(tmp), str(SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BackendUnavailableError(
            f"building the gVisor socket helper failed: {proc.stderr.strip()[-500:]}",
            hint="apt-get install gcc libc6-dev",
        )
    os.replace(tmp, target)
    return target
