"""An exec in its own mount namespace: the verifier's private ``/tests`` and ``/logs/verifier``.

Shared-mode verification runs in the sandbox the agent used, where processes the agent left
running (a ``setsid`` loop, an inotify watcher) keep running. :class:`IsolatedExec` asks the
backend's in-sandbox agent to give one command fresh tmpfs directories that exist only in that
command's mount namespace, to fill them with the host's files before the command starts, and to
hand back the files of one of them after it ends, before the namespace goes away. Nothing
outside that namespace can pre-write or alter them by path.

Nor through a process: on namespace and microvm, ordinary commands run with Docker's default
capability set (no CAP_SYS_ADMIN, no CAP_SYS_PTRACE) and only isolated commands keep a
marker capability (CAP_WAKE_ALARM), so the kernel's ptrace access check refuses what the
agent left running ``/proc/PID/root`` and ``/proc/PID/ns/mnt`` (setns) of a verifier process.
gVisor (runsc 20221219) has no per-command mount namespace: backends that cannot isolate
raise :class:`~rollbox.errors.CapabilityError` and the verifier falls back (see
:mod:`rollbox.rollouts.verifier_exec`).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from rollbox.errors import InvalidInputError

COLLECT_MAX = 64 << 20
"""Bytes of collected files the agents return per exec (the rest is cut, ``truncated``)."""


@dataclass
class IsolatedExec:
    """How one exec is isolated from the sandbox's other processes; filled in by the exec."""

    fresh: tuple[str, ...] = ()
    """Absolute directories mounted fresh (empty tmpfs) in the command's own mount namespace."""
    files: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Files written before the command starts: absolute path (under one of ``fresh``) ->
    (mode, content)."""
    collect: str | None = None
    """One of ``fresh`` whose regular files are returned (in :attr:`collected`) after the
    command ends."""
    kill_others: bool = False
    """Kill every other process of the sandbox (PID 1 excepted) before the command starts."""
    timeout_s: float | None = None
    """The in-sandbox agent's own deadline for the command: at it, every process of the
    command's mount namespace is killed and the collected files still come back (pass a
    longer ``exec`` timeout as the backstop)."""
    collected: dict[str, bytes] = field(default_factory=dict)
    """Output: path relative to :attr:`collect` -> content."""
    truncated: bool = False
    """Output: some collected file was cut at :data:`COLLECT_MAX`."""
    timed_out: bool = False
    """Output: :attr:`timeout_s` passed and the command's namespace was killed."""

    def check(self) -> None:
        """Refuse relative or non-normal paths and files outside the fresh directories.

        Raises:
            InvalidInputError: a path is not absolute and normal, or lies outside ``fresh``.
        """
        for d in self.fresh:
            if not d.startswith("/") or posixpath.normpath(d) != d or d == "/":
                raise InvalidInputError(f"isolated exec: bad fresh directory {d!r}")
        for path in self.files:
            if posixpath.normpath(path) != path or not any(
                path.startswith(d + "/") for d in self.fresh
            ):
                raise InvalidInputError(f"isolated exec: {path!r} is not inside a fresh dir")
        if self.collect is not None and self.collect not in self.fresh:
            raise InvalidInputError(f"isolated exec: collect dir {self.collect!r} is not fresh")

    def add_collected(self, rel: str, data: bytes, full_size: int) -> None:
        """Record one file the agent returned (``rel`` must stay inside the collect dir)."""
        norm = posixpath.normpath(rel)
        if norm.startswith(("/", "..")) or norm in (".", ""):
            return
        self.collected[norm] = data
        if len(data) < full_size:
            self.truncated = True
