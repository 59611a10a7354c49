"""The shared-mode verifier's exec: its own ``/tests`` and ``/logs/verifier``.

In shared mode the verifier runs in the sandbox the agent used. Processes the agent left
running keep running (tests may query a server the agent started), so the verifier must not
trust anything they can reach. The command runs in its own mount namespace (see
:class:`~rollbox.backends.isolation.IsolatedExec`) where ``/tests`` and ``/logs/verifier``
are fresh tmpfs directories: the tests are written there by the in-sandbox agent before
the command starts, and ``/logs/verifier`` is returned by it after the command ends. A
``reward.txt`` written in advance, a loop rewriting it, a watcher rewriting
``/tests/test.sh``: none of them can reach those directories by path.

What this does not cover: shared mode still trusts the agent's filesystem (the verifier runs
the agent's ``bash``, ``python3``...), and a root process the agent left running can reach
a verifier process's files through ``/proc/PID/root``; ``[rollbox] stop_agent_before_verify``
closes the latter, separate mode closes both.

A backend that cannot give an exec its own mount namespace (gVisor here) gets the weaker
path: both directories emptied and the tests uploaded just before the command, with
``verifier_isolation = "none"`` recorded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rollbox.backends.isolation import IsolatedExec
from rollbox.errors import CapabilityError, InvalidInputError
from rollbox.models import ExecResult, FsChange
from rollbox.rollouts.verifier import REWARD_DIR

TESTS_DIR = "/tests"
TESTS_MAX = 48 << 20
"""Bytes of ``tests/`` carried into the private ``/tests`` (the exec request's bound)."""

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/etc", "/opt", "/lib")
"""Prefixes whose changes are listed as ``suspicious_changes`` (``/lib`` covers ``/lib*``)."""

PROTECT = True
"""Test-only switch: False runs the verifier the old, unprotected way (shared directories,
nothing emptied), so tests can show the forged rewards would count without the guard."""


def protected() -> bool:
    """False only when a test switched the guard off (:data:`PROTECT`)."""
    return PROTECT


def suspicious(changes: list[FsChange]) -> list[str]:
    """Paths of ``changes`` under the system directories (``/lib*`` included), sorted."""
    out = []
    for c in changes:
        top = "/" + c.path.lstrip("/").split("/", 1)[0]
        if top in SYSTEM_DIRS or top.startswith("/lib"):
            out.append(c.path)
    return sorted(out)


def pack_tests(tests_dir: Path) -> dict[str, tuple[int, bytes]]:
    """The task's ``tests/`` as files under ``/tests`` (symlinks resolved inside ``tests/``).

    Raises:
        InvalidInputError: a link leaves ``tests/``, or the files exceed :data:`TESTS_MAX`.
    """
    root = tests_dir.resolve()
    files: dict[str, tuple[int, bytes]] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            full = Path(dirpath) / name
            real = full.resolve()
            if not real.is_relative_to(root):
                raise InvalidInputError(f"tests/{full.relative_to(root)} links outside tests/")
            if not real.is_file():
                continue
            data = real.read_bytes()
            total += len(data)
            if total > TESTS_MAX:
                raise InvalidInputError(f"tests/ is larger than {TESTS_MAX >> 20} MiB")
            rel = full.relative_to(root).as_posix()
            files[f"{TESTS_DIR}/{rel}"] = (real.stat().st_mode & 0o7777, data)
    return files


@dataclass
class VerifierRun:
    """What the verifier's exec produced."""

    result: ExecResult
    """The command's result."""
    logs: dict[str, bytes] | None
    """``/logs/verifier`` files (relative path -> content) when the exec was isolated; None
    when they must be downloaded from the sandbox (the weaker path)."""
    isolation: str
    """``private`` (own mount namespace) or ``none``."""


def isolated_request(tests_dir: Path, *, stop_agent: bool) -> IsolatedExec:
    """The :class:`IsolatedExec` of a shared-mode verifier."""
    return IsolatedExec(
        fresh=(TESTS_DIR, REWARD_DIR),
        files=pack_tests(tests_dir),
        collect=REWARD_DIR,
        kill_others=stop_agent,
    )


def is_unsupported(exc: CapabilityError) -> bool:
    """True when ``exc`` says the backend cannot give an exec a private mount namespace."""
    return "private mount namespace" in str(exc)
