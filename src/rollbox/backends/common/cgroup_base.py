"""The cgroup interface and what both implementations share (no implementation here).

:class:`Cgroup` is the interface the backends use; ``cgroups_v1.CgroupV1`` and
``cgroups_v2.CgroupV2`` implement it and are registered by the factory module
``rollbox.backends.common.cgroups`` (which every caller imports), so this module imports
neither and there is no import cycle.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rollbox.errors import BackendError, BackendUnavailableError, LimitsError
from rollbox.models import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")

CONTROLLERS: tuple[str, ...] = ("pids", "memory", "cpu", "cpuacct", "freezer", "blkio")
"""The v1 controllers a sandbox's group is made in (each mounted separately on v1)."""

CPU_PERIOD_US = 100_000
MIN_MEMORY_MB = 8

CgroupMode = Literal["v1", "v2", "hybrid", "none"]


def _cgroup_mounts() -> tuple[list[str], list[str]]:
    """Mount points of v1 (``cgroup``) and v2 (``cgroup2``) hierarchies, from mountinfo."""
    v1: list[str] = []
    v2: list[str] = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return v1, v2
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split(" ")
        fstype = right.split(" ", 1)[0]
        if len(fields) > 4 and fstype == "cgroup":
            v1.append(fields[4])
        elif len(fields) > 4 and fstype == "cgroup2":
            v2.append(fields[4])
    return v1, v2


def cgroup_mode() -> CgroupMode:
    """How this host mounts cgroups: ``v1``, ``v2`` (unified only), ``hybrid`` or ``none``."""
    v1, v2 = _cgroup_mounts()
    if v1 and v2:
        return "hybrid"
    if v1:
        return "v1"
    if v2:
        return "v2"
    return "none"


def cgroup_version() -> int:
    """The implementation rollbox uses here: 1 (v1 or hybrid host) or 2 (unified host).

    Raises:
        BackendUnavailableError: neither a v1 freezer nor a cgroup2 root is mounted.
    """
    return _version(str(CGROUP_ROOT))


@functools.cache
def _version(root: str) -> int:
    base = Path(root)
    # The v1 path whenever v1 controllers are there: hybrid hosts behave as before.
    if (base / "freezer" / "cgroup.procs").exists() and (base / "memory").is_dir():
        return 1
    if (base / "cgroup.controllers").exists():
        return 2
    raise BackendUnavailableError(
        f"no usable cgroup hierarchy at {base}: neither the v1 freezer controller nor "
        "cgroup2 is mounted",
        hint=f"mount cgroup2 there: mount -t cgroup2 none {base}",
    )


def parent_name(home_tag: str) -> str:
    """Name of the per-home parent group."""
    return f"rollbox-{home_tag}"


def cgroup_name(home_tag: str, sandbox_id: str) -> str:
    """Relative name of a sandbox's group (below the cgroup root on v1, below rollbox's
    delegated cgroup on v2)."""
    return f"{parent_name(home_tag)}/{sandbox_id}"


def check_limits(limits: Limits) -> None:
    """Refuse limits this host cannot meet.

    Raises:
        LimitsError: naming the limit and what this host offers.
    """
    ncpu = os.cpu_count() or 1
    if limits.cpus is not None and limits.cpus > ncpu:
        raise LimitsError(
            f"cpus={limits.cpus:g} exceeds this host's {ncpu} cpus", hint=f"use cpus <= {ncpu}"
        )
    if limits.memory_mb is not None:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
        if limits.memory_mb > total_mb:
            raise LimitsError(
                f"memory_mb={limits.memory_mb} exceeds this host's {total_mb} MiB",
                hint=f"use memory_mb <= {total_mb}",
            )
        if limits.memory_mb < MIN_MEMORY_MB:
            raise LimitsError(
                f"memory_mb={limits.memory_mb} is too small to start anything",
                hint=f"use memory_mb >= {MIN_MEMORY_MB}",
            )


@dataclass
class Cgroup:
    """One sandbox's (or one exec's) group; the methods hide the cgroup version."""

    name: str
    """Relative path, e.g. ``rollbox-<hometag>/<sbx-id>``."""
    paths: dict[str, Path] = field(default_factory=dict)
    """v1 controller name -> absolute directory (on v2 every name maps to the one group)."""

    version = 0
    """1 or 2: the cgroup version of the implementation."""

    @classmethod
    def create(cls, home_tag: str, sandbox_id: str, limits: Limits) -> Cgroup:
        """Make the sandbox's group and apply ``limits``.

        Raises:
            LimitsError: the limits cannot be met on this host (or the kernel refused one).
            BackendUnavailableError: the controllers a sandbox needs are not delegated here.
            BackendError: the group could not be made (nothing is left behind).
        """
        return _impl().create(home_tag, sandbox_id, limits)

    @classmethod
    def open(cls, home_tag: str, sandbox_id: str) -> Cgroup:
        """The existing group of a sandbox (no check that it exists; see :meth:`exists`)."""
        return _impl().open(home_tag, sandbox_id)

    def exists(self) -> bool:
        """True when the group exists."""
        raise NotImplementedError

    def apply(self, limits: Limits) -> None:
        """Write cpu, memory (no swap) and pids limits.

        Raises:
            LimitsError: the kernel refused a limit (v2) .
        """
        raise NotImplementedError

    def clear_cpu_limit(self) -> None:
        """Remove the cpu quota (``apply`` with ``cpus`` sets it again)."""
        raise NotImplementedError

    def child(
        self,
        name: str,
        controllers: tuple[str, ...] | None = None,
        *,
        pids_max: int | None = None,
    ) -> Cgroup:
        """A sub-group ``name`` (made now), e.g. one per exec.

        Args:
            name: relative name below this group.
            controllers: v1 only: the controllers to make it in (default: all of this
                group's); v2 groups are one directory.
            pids_max: a ``pids.max`` for the sub-group.

        Raises:
            BackendError: the group could not be made.
        """
        raise NotImplementedError

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a process writes its pid to in order to join."""
        raise NotImplementedError

    def add(self, pid: int) -> None:
        """Move ``pid`` into this group."""
        for path in self.procs_files():
            with open(path, "w") as f:
                f.write(str(pid))

    def pids(self) -> list[int]:
        """Every pid in this group and its sub-groups."""
        raise NotImplementedError

    def remove_if_empty(self) -> bool:
        """rmdir this (leaf) group when no process is left in it; True when removed."""
        raise NotImplementedError

    def freeze(self, timeout: float = 5.0) -> None:
        """Freeze every task and wait until it is frozen.

        Raises:
            BackendError: the group did not freeze within ``timeout``.
        """
        raise NotImplementedError

    def thaw(self, timeout: float = 5.0) -> None:
        """Thaw every task and wait until thawed."""
        raise NotImplementedError

    def is_frozen(self) -> bool:
        """True when the group is frozen."""
        raise NotImplementedError

    def oom_kills(self) -> int:
        """OOM kills in this group and its sub-groups."""
        raise NotImplementedError

    def pids_max_hits(self) -> int:
        """Forks refused by ``pids.max`` in this group and its sub-groups."""
        raise NotImplementedError

    def memory_usage(self) -> int:
        """Bytes charged to the group now."""
        raise NotImplementedError

    def sigkill_frozen(self, pids: list[int]) -> None:
        """One kill round: freeze (so nothing can fork away), SIGKILL ``pids``, thaw; a
        freeze or thaw that fails only makes the round less certain."""
        frozen = False
        try:
            self.freeze(timeout=2.0)
            frozen = True
        except (BackendError, OSError):
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if frozen:
            try:
                self.thaw(timeout=2.0)
            except (BackendError, OSError):
                pass

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every task of the group and its sub-groups and wait until empty.

        Raises:
            BackendError: tasks survive ``timeout``.
        """
        raise NotImplementedError

    def destroy(self) -> None:
        """Kill every task, then remove the group (children first); idempotent. Also
        removes the per-home parent when it became empty."""
        raise NotImplementedError

    @property
    def oci_path(self) -> str:
        """``linux.cgroupsPath`` for an OCI runtime that puts its processes in here."""
        return f"/{self.name}"


_IMPLS: dict[int, type[Cgroup]] = {}
"""cgroup version -> implementation (filled by ``rollbox.backends.common.cgroups``)."""


def register(version: int, impl: type[Cgroup]) -> None:
    """Make ``impl`` the implementation for cgroup ``version`` hosts."""
    _IMPLS[version] = impl


def _impl() -> type[Cgroup]:
    version = cgroup_version()
    try:
        return _IMPLS[version]
    except KeyError:
        raise BackendUnavailableError(
            f"no cgroup v{version} implementation is registered",
            hint="import rollbox.backends.common.cgroups",
        ) from None


def rmdir_retry(path: Path, attempts: int = 50) -> None:
    """rmdir a cgroup dir, retrying while it is still busy (tasks exiting)."""
    for i in range(attempts):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or i == attempts - 1:
                raise
            time.sleep(0.01 * min(i + 1, 10))


def sum_keyed(root: Path, filename: str, key: str) -> int:
    """Sum of ``key N`` lines of ``filename`` in ``root`` and every group below it (a group
    that vanished or lacks the file counts 0)."""
    total = 0
    for dirpath, _dirs, _files in os.walk(root):
        try:
            text = Path(dirpath, filename).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                total += int(value)
    return total
