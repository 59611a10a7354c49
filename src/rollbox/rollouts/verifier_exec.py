"""The shared-mode verifier's exec: its own ``/tests`` and ``/logs/verifier``.

In shared mode the verifier runs in the sandbox the agent used. Processes the agent left
running keep running (tests may query a server the agent started), so the verifier must not
trust anything they can reach. The command runs in its own mount namespace (see
:class:`~rollbox.backends.isolation.IsolatedExec`) where ``/tests`` and ``/logs/verifier``
are fresh tmpfs directories: the tests are written there by the in-sandbox agent before
the command starts, and ``/logs/verifier`` is returned by it after the command ends. A
``reward.txt`` written in advance, a loop rewriting it, a watcher rewriting
``/tests/test.sh``: none of them can reach those directories by path.

A process the agent left running could still reach a verifier process's files through
``/proc/PID/root`` or ``setns``; on namespace and microvm, agent commands run without
CAP_SYS_ADMIN and CAP_SYS_PTRACE (Docker's default set) and only verifier commands keep a
marker capability (CAP_WAKE_ALARM), so the kernel's ptrace access check refuses that.
What this does not cover: shared mode still trusts the agent's filesystem (the verifier runs
the agent's ``bash``, ``python3``...); separate mode closes that.

A backend that cannot give an exec its own mount namespace (gVisor here: runsc 20221219)
gets the weaker path: both directories emptied and the tests uploaded just before the
command. There, by default, shared mode first stops every process the agent left running
(recorded ``verifier_isolation = "stopped-agent"``), since nothing else would keep them away
from the reward. A task whose tests query a service the agent started must opt out with
``[rollbox] stop_agent_before_verify = false`` (recorded ``"none"``; ``rollbox report``
counts such rollouts as unprotected). Then only two tamper checks remain, which catch
interference but cannot prevent it: every uploaded file must still be in ``/tests``
unchanged (files added there are not judged: pytest writes ``__pycache__``), and the reward
files must not change after the command ended (a process left running keeps writing them).
A forger that writes once at the right moment gets past them.

Tried on gVisor: the verifier as a second container of the same runsc sandbox (each
container has its own mount namespace; the netstack is shared, so agent services stay on
loopback). Its bind mounts of fresh host dirs on ``/tests`` and ``/logs/verifier`` worked,
but runsc 20221219 starts that container's gofer without the sandbox's ``--host-uds=create``
and ``--file-access=shared``, so an agent socket inside never reaches the host, and the
first container's processes see the second's in ``/proc`` (the root pid namespace). Driving
it through ``runsc exec`` instead is the next thing to try.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox.backends.isolation import IsolatedExec
from rollbox.errors import BackendError, CapabilityError, InvalidInputError, RollboxError
from rollbox.models import ExecResult, FsChange
from rollbox.rollouts.tasks import RollboxSection
from rollbox.rollouts.verifier import REWARD_DIR, REWARD_JSON, REWARD_TXT
from rollbox.sandbox import AsyncSandbox

SETTLE_S = 0.3
"""How long the reward files must stay unchanged after the command ends (weaker path)."""

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
    tampered: str | None = None
    """Weaker path only: what the tamper checks caught (then the reward does not count)."""


def isolated_request(tests_dir: Path, *, stop_agent: bool) -> IsolatedExec:
    """The :class:`IsolatedExec` of a shared-mode verifier."""
    return IsolatedExec(
        fresh=(TESTS_DIR, REWARD_DIR),
        files=pack_tests(tests_dir),
        collect=REWARD_DIR,
        kill_others=stop_agent,
    )


def unisolated_stop(settings: RollboxSection, mode: str) -> tuple[bool, str]:
    """On a backend that cannot isolate the verifier: whether to stop the agent's processes
    first, and the ``verifier_isolation`` to record.

    Shared mode stops them unless the task set ``stop_agent_before_verify = false``
    explicitly; separate mode has none of them in the verifier's sandbox.
    """
    explicit = "stop_agent_before_verify" in settings.model_fields_set
    if mode != "shared" or (explicit and not settings.stop_agent_before_verify):
        return False, "none"
    return True, "stopped-agent"


def is_unsupported(exc: CapabilityError) -> bool:
    """True when ``exc`` says the backend cannot give an exec a private mount namespace."""
    return "private mount namespace" in str(exc)


async def run_unisolated(
    sbx: AsyncSandbox,
    tests_dir: Path,
    cmd: list[str],
    opts: dict[str, Any],
    *,
    stop: bool,
    scratch: Path,
) -> VerifierRun:
    """The weaker path for a backend without private execs (see the module docstring).

    Raises:
        ExecTimeoutError: the verifier ran past its timeout.
    """
    if stop:
        await sbx.exec(["true"], isolate=IsolatedExec(kill_others=True))
    expected = pack_tests(tests_dir)
    await sbx.exec(["rm", "-rf", TESTS_DIR, REWARD_DIR])
    await sbx.files.upload(tests_dir, TESTS_DIR)
    result = await sbx.exec(cmd, **opts)
    tampered = await _reward_moves(sbx) or await _tests_changed(sbx, expected, scratch)
    return VerifierRun(result, None, "none", tampered)


async def _reward_moves(sbx: AsyncSandbox) -> str | None:
    """A message when the reward files change after the verifier's command ended."""
    probe = ["stat", "-c", "%n %s %y", REWARD_TXT, REWARD_JSON]
    before = (await sbx.exec(probe)).stdout
    await asyncio.sleep(SETTLE_S)
    after = (await sbx.exec(probe)).stdout
    if before != after:
        return (
            f"{REWARD_DIR} changed after the verifier ended: a process the agent left running "
            "writes it (set [rollbox] stop_agent_before_verify or use separate mode)"
        )
    return None


async def _tests_changed(
    sbx: AsyncSandbox, expected: dict[str, tuple[int, bytes]], scratch: Path
) -> str | None:
    """A message when a file uploaded to ``/tests`` changed or vanished."""
    dest = scratch / "tests"
    shutil.rmtree(scratch, True)
    scratch.mkdir(parents=True)
    try:
        try:
            await sbx.files.download(TESTS_DIR, dest)
        except BackendError:
            raise
        except (RollboxError, OSError):
            return f"{TESTS_DIR} vanished while the verifier ran"
        found: dict[str, bytes] = {}
        for dirpath, _dirs, names in os.walk(dest):
            for name in names:
                full = Path(dirpath) / name
                rel = full.relative_to(dest).as_posix()
                found[f"{TESTS_DIR}/{rel}"] = b"" if full.is_symlink() else full.read_bytes()
        # Only the uploaded files: test.sh may add its own (pytest's __pycache__, build output).
        for path in sorted(expected):
            if path not in found or found[path] != expected[path][1]:
                return (
                    f"{path} changed while the verifier ran: a process the agent left running "
                    "altered the tests (set [rollbox] stop_agent_before_verify or use separate "
                    "mode)"
                )
        return None
    finally:
        shutil.rmtree(scratch, True)
