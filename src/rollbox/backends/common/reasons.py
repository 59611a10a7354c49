"""Why a command ended: the sandbox limits it ran into, found the same way on every backend.

The four reasons (``models.LimitReason``):

* ``oom_killed`` — the memory limit: the kernel OOM-killed a process (namespace: the
  sandbox's memory cgroup; gVisor: the host cgroup's OOM killer, which ends the sentry and the
  sandbox with it; microvm: the exec's cgroup v2 ``memory.events`` in the guest);
* ``pids_exhausted`` — the pids limit: a fork failed (namespace: ``pids.events`` of the
  exec's own group; gVisor: ``RLIMIT_NPROC`` inside leaves no counter, so a fork failure
  message on the command's stderr, or the host task limit killing the sandbox; microvm: the
  exec's guest ``pids.events``);
* ``disk_full`` — the disk limit: the writable layer (``disk_mb``) was full when the command
  ended (namespace/gVisor: the upper dir's tmpfs; microvm: the guest's root, reported by the
  guest agent);
* ``ttl_expired`` — the TTL: the reaper destroyed the sandbox under the command.

:func:`tracked` wraps each backend's ``exec``: it turns a failure of a sandbox whose TTL has
passed into :class:`~rollbox.errors.SandboxExpiredError` naming the TTL, and remembers on the
handle every reason its commands ran into, which the rollout runner reads around its phases
(:func:`seen`) -- so a Python policy's own execs count too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from rollbox.backends.common.cgroup_base import sum_keyed
from rollbox.errors import BackendError, ExecTimeoutError, SandboxExpiredError
from rollbox.models import ExecResult, LimitReason, SandboxInfo, utcnow

if TYPE_CHECKING:
    from rollbox.backends.common.cgroups import Cgroup

REASONS: tuple[LimitReason, ...] = ("oom_killed", "pids_exhausted", "disk_full", "ttl_expired")
"""Every reason, in the order they are listed."""

DISK_FULL_MIN_BYTES = 64 << 10
"""A writable layer with less free space than this (or than 1 % of it) counts as full."""

_FORK_FAILED = re.compile(
    rb"fork: (retry: )?Resource temporarily unavailable"  # bash
    rb"|can't fork"  # dash, busybox
    rb"|Cannot fork"
    rb"|BlockingIOError: \[Errno 11\] Resource temporarily unavailable"  # python os.fork
)
"""What shells and Python print when fork() fails with EAGAIN (the pids limit)."""

_ATTR = "_rollbox_reasons"

TTL_GRACE_S = 5.0
"""A command still running this long after its sandbox's TTL ends with ``ttl_expired``
even when the reaper has not destroyed the sandbox yet."""


def is_full(free_bytes: int, total_bytes: int) -> bool:
    """True when a filesystem of ``total_bytes`` with ``free_bytes`` left counts as full."""
    return total_bytes > 0 and free_bytes < max(DISK_FULL_MIN_BYTES, total_bytes // 100)


def dir_full(path: Path) -> bool:
    """True when the filesystem holding ``path`` is full (see :func:`is_full`); False when
    it cannot be looked at (the sandbox is gone)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    # f_bavail: what a writer inside got before ENOSPC (the same as f_bfree on a tmpfs)
    return is_full(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def fork_failed(stderr: str | bytes) -> bool:
    """True when ``stderr`` holds a shell's or Python's "cannot fork" (EAGAIN) message."""
    data = stderr.encode(errors="replace") if isinstance(stderr, str) else stderr
    return _FORK_FAILED.search(data) is not None


def pids_max_hits(cg: Cgroup) -> int:
    """How often a fork in ``cg`` (and its sub-groups) failed at a pids limit."""
    method = getattr(cg, "pids_max_hits", None)
    if method is not None:
        try:
            return int(method())
        except NotImplementedError:
            pass  # a bare group (no version picked): read pids.events below
    return sum_keyed(cg.paths["pids"], "pids.events", "max")


def ttl_passed(info: SandboxInfo) -> bool:
    """True when the sandbox has a TTL and it has passed."""
    return info.expires_at is not None and utcnow() >= info.expires_at


def expired_error(info: SandboxInfo) -> SandboxExpiredError:
    """The error naming the TTL a sandbox reached."""
    ttl = info.spec.ttl_s
    when = info.expires_at.strftime("%H:%M:%S") if info.expires_at is not None else "?"
    return SandboxExpiredError(
        f"sandbox {info.id} reached its TTL of {ttl:g} s at {when} UTC and was destroyed"
        if ttl is not None
        else f"sandbox {info.id} reached its TTL at {when} UTC and was destroyed",
        hint="give it a longer ttl",
    )


def note(handle: object, reasons: Sequence[str]) -> None:
    """Remember ``reasons`` on ``handle`` (each once, first seen first)."""
    if not reasons:
        return
    have: list[str] = handle.__dict__.setdefault(_ATTR, [])
    have.extend(r for r in reasons if r not in have)


def seen(handle: object) -> list[str]:
    """Every reason the handle's commands ran into so far, first seen first."""
    return list(getattr(handle, "__dict__", {}).get(_ATTR, []))


class _HasInfo(Protocol):
    @property
    def info(self) -> SandboxInfo: ...


H = TypeVar("H", bound=_HasInfo)
P = ParamSpec("P")


def tracked(
    fn: Callable[Concatenate[H, P], Awaitable[ExecResult]],
) -> Callable[Concatenate[H, P], Coroutine[Any, Any, ExecResult]]:
    """Wrap a backend's ``exec``: note the reasons of its result (or of the error it
    raised) on the handle, and name the TTL when the sandbox failed because it expired."""

    async def exec_tracked(self: H, /, *args: P.args, **kwargs: P.kwargs) -> ExecResult:
        info = self.info
        left = None if info.expires_at is None else (info.expires_at - utcnow()).total_seconds()
        if left is not None and left <= 0:
            note(self, ["ttl_expired"])
            raise expired_error(info)
        try:
            # The reaper destroys the sandbox at its TTL; should it be late (busy, or not
            # started yet), the command ends at the TTL all the same.
            async with asyncio.timeout(None if left is None else left + TTL_GRACE_S):
                result = await fn(self, *args, **kwargs)
        except ExecTimeoutError as exc:
            note(self, exc.reasons)
            raise
        except SandboxExpiredError:
            note(self, ["ttl_expired"])
            raise
        except TimeoutError:  # our deadline above (ExecTimeoutError is handled before)
            note(self, ["ttl_expired"])
            raise expired_error(info) from None
        except (BackendError, OSError) as exc:
            if isinstance(exc, BackendError) and exc.reason is not None:
                note(self, [exc.reason])
                raise
            info = self.info
            if ttl_passed(info):
                note(self, ["ttl_expired"])
                raise expired_error(info) from None
            raise
        note(self, result.reasons)
        return result

    functools.update_wrapper(exec_tracked, fn)
    return exec_tracked
