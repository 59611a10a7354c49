"""Helpers for tests that run the ``rollbox`` console script against a data home
(importable as ``integration.clihelp``: pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from requirebackends import backend_unavailable
from rollbox.backends.registry import get_backend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

ROLLBOX = str(Path(sys.executable).parent / "rollbox")


def run_cli(home: Home, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``rollbox ARGS…`` with ``ROLLBOX_HOME`` set to ``home``."""
    env = {**os.environ, "ROLLBOX_HOME": str(home.root)}
    return subprocess.run(
        [ROLLBOX, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def need_backend(backend: str, home: Home) -> None:
    """Skip the test when ``backend`` cannot run on this machine."""
    try:
        get_backend(backend, home).prepare()
    except BackendUnavailableError as exc:
        backend_unavailable(backend, exc)
