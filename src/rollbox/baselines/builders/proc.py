"""Running the external tools (mmdebstrap, buildah, skopeo) with captured output."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess

from rollbox.errors import BackendUnavailableError

_PACKAGES = {"mmdebstrap": "mmdebstrap", "buildah": "buildah", "skopeo": "skopeo"}


def need(tool: str) -> str:
    """Path of ``tool``, or a clear error naming the Debian package to install."""
    path = shutil.which(tool)
    if path is None:
        pkg = _PACKAGES.get(tool, tool)
        raise BackendUnavailableError(
            f"{tool} is not installed", hint=f"apt-get install {pkg} (or run `make setup`)"
        )
    return path


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # if rollbox is killed, the tool is interrupted too instead of finishing a build that
    # nobody will commit (and leaving its result behind in containers-storage)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def run(
    cmd: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; stdout and stderr captured together, never raises on exit status.

    ``env`` is added to this process's environment for the command.
    """
    need(cmd[0])
    return subprocess.run(
        cmd,
        env=None if env is None else {**os.environ, **env},
        preexec_fn=_die_with_parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
