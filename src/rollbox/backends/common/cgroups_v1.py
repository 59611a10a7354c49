"""cgroup v1 groups (v1 and hybrid hosts: each v1 controller mounted on its own).

Every sandbox gets ``rollbox-<hometag>/<sandbox-id>`` in each controller of
:data:`~rollbox.backends.common.cgroups.CONTROLLERS`. OCI runtimes given
``linux.cgroupsPath = /rollbox-<tag>/<id>`` also create the group in the other hierarchies
(cpuset, devices...), so removal walks every mounted v1 hierarchy.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rollbox.backends.common import cgroup_base as _cg
from rollbox.backends.common.cgroup_base import (
    CONTROLLERS,
    CPU_PERIOD_US,
    Cgroup,
    cgroup_name,
    check_limits,
    parent_name,
)
from rollbox.errors import BackendError
from rollbox.models import Limits


def _hierarchies() -> list[Path]:
    """Every mounted v1 hierarchy (controllers and named ones), not the unified one."""
    out = []
    try:
        entries = sorted(_cg.CGROUP_ROOT.iterdir())
    except FileNotFoundError:
        return []
    for p in entries:
        if p.name == "unified" or p.is_symlink() or not p.is_dir():
            continue
        if (p / "cgroup.procs").exists():
            out.append(p)
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class CgroupV1(Cgroup):
    """One sandbox's (or one exec's) group in every v1 controller."""

    version = 1

    @classmethod
    def _at(cls, name: str) -> CgroupV1:
        return cls(name, {c: _cg.CGROUP_ROOT / c / name for c in CONTROLLERS})

    @classmethod
    def create(cls, home_tag: str, sandbox_id: str, limits: Limits) -> CgroupV1:
        """Make the sandbox's group in every controller and apply ``limits``; see
        :meth:`Cgroup.create`."""
        check_limits(limits)
        cg = cls._at(cgroup_name(home_tag, sandbox_id))
        try:
            cg._mkdirs()
            cg.apply(limits)
        except OSError as exc:
            cg.destroy()
            raise BackendError(f"cannot create cgroup {cg.name}: {exc}") from exc
        except BaseException:
            cg.destroy()
            raise
        return cg

    @classmethod
    def open(cls, home_tag: str, sandbox_id: str) -> CgroupV1:
        """The existing group of a sandbox (no check that it exists; see :meth:`exists`)."""
        return cls._at(cgroup_name(home_tag, sandbox_id))

    def exists(self) -> bool:
        """True when the group exists in the memory controller."""
        return self.paths["memory"].is_dir()

    def _mkdirs(self) -> None:
        for path in self.paths.values():
            # A concurrent destroy of the last sibling may rmdir the parent between our
            # two mkdirs; retry a few times.
            for attempt in range(5):
                try:
                    path.mkdir(parents=True, exist_ok=True)
                    break
                except FileNotFoundError:
                    if attempt == 4:
                        raise

    def apply(self, limits: Limits) -> None:
        """Write cpu quota, memory (+memsw) limit and pids.max."""
        cpu = self.paths["cpu"]
        if limits.cpus is not None:
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(limits.cpus * CPU_PERIOD_US))))
        mem = self.paths["memory"]
        if limits.memory_mb is not None:
            value = str(limits.memory_mb << 20)
            memsw = mem / "memory.memsw.limit_in_bytes"
            # memsw must stay >= the memory limit (equal means no swap for the sandbox):
            # when raising, raise memsw first.
            current = int((mem / "memory.limit_in_bytes").read_text())
            order = [mem / "memory.limit_in_bytes", memsw]
            if (limits.memory_mb << 20) > current:
                order.reverse()
            for path in order:
                if path.exists():
                    _write(path, value)
            _write(mem / "memory.swappiness", "0")
        if limits.pids is not None:
            _write(self.paths["pids"] / "pids.max", str(limits.pids))

    def clear_cpu_limit(self) -> None:
        """``cpu.cfs_quota_us = -1``."""
        _write(self.paths["cpu"] / "cpu.cfs_quota_us", "-1")

    def child(
        self,
        name: str,
        controllers: tuple[str, ...] | None = None,
        *,
        pids_max: int | None = None,
    ) -> CgroupV1:
        """A sub-group ``name`` in ``controllers`` (default: all of this group's); see
        :meth:`Cgroup.child`."""
        ctrls = tuple(self.paths) if controllers is None else controllers
        cg = CgroupV1(f"{self.name}/{name}", {c: self.paths[c] / name for c in ctrls})
        try:
            cg._mkdirs()
            if pids_max is not None:
                _write(cg.paths["pids"] / "pids.max", str(pids_max))
        except OSError as exc:
            cg.destroy()
            raise BackendError(f"cannot create cgroup {cg.name}: {exc}") from exc
        return cg

    def procs_files(self) -> list[Path]:
        """``cgroup.procs`` in every controller of the group."""
        return [p / "cgroup.procs" for p in self.paths.values()]

    def remove_if_empty(self) -> bool:
        """rmdir the group in every controller when its pids group holds no process."""
        probe = self.paths.get("pids") or next(iter(self.paths.values()))
        try:
            if (probe / "cgroup.procs").read_text().strip():
                return False
            for path in self.paths.values():
                path.rmdir()
        except OSError:
            return False
        return True

    def pids(self) -> list[int]:
        """Every pid in this group and its sub-groups (from the pids controller)."""
        out: set[int] = set()
        root = self.paths["pids"]
        for dirpath, _dirs, _files in os.walk(root):
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    out.update(int(x) for x in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
        return sorted(out)

    def freeze(self, timeout: float = 5.0) -> None:
        """Freeze every task (freezer.state FROZEN) and wait until it is frozen."""
        self._freezer("FROZEN", timeout)

    def thaw(self, timeout: float = 5.0) -> None:
        """Thaw every task and wait until thawed."""
        self._freezer("THAWED", timeout)

    def _freezer(self, state: str, timeout: float) -> None:
        path = self.paths["freezer"] / "freezer.state"
        deadline = time.monotonic() + timeout
        _write(path, state)
        while True:
            try:
                current = path.read_text().strip()
            except FileNotFoundError:
                return
            if current == state:
                return
            if time.monotonic() > deadline:
                raise BackendError(f"cgroup {self.name} stuck in {current} (wanted {state})")
            # FREEZING can need a nudge when new tasks arrived meanwhile.
            _write(path, state)
            time.sleep(0.002)

    def is_frozen(self) -> bool:
        """True when the freezer reports FROZEN."""
        try:
            return (self.paths["freezer"] / "freezer.state").read_text().strip() == "FROZEN"
        except FileNotFoundError:
            return False

    def oom_kills(self) -> int:
        """OOM kills in this group and its sub-groups (``oom_kill`` of memory.oom_control)."""
        return _cg.sum_keyed(self.paths["memory"], "memory.oom_control", "oom_kill")

    def pids_max_hits(self) -> int:
        """Forks refused by ``pids.max`` in this group and its sub-groups.

        The v1 kernel counts a refused fork (``max N`` of ``pids.events``) in the forking
        task's own group, so the sub-groups are summed.
        """
        return _cg.sum_keyed(self.paths["pids"], "pids.events", "max")

    def memory_usage(self) -> int:
        """Bytes charged to the group now."""
        try:
            return int((self.paths["memory"] / "memory.usage_in_bytes").read_text())
        except FileNotFoundError:
            return 0

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every task (frozen first so nothing can fork away) and wait until empty."""
        if not self.paths["pids"].is_dir():
            return
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                break
            self.sigkill_frozen(pids)
            if time.monotonic() > deadline:
                raise BackendError(f"cgroup {self.name}: tasks survive SIGKILL: {pids}")
            time.sleep(0.005)
        # A group left FROZEN keeps later tasks frozen; leave it thawed.
        if self.is_frozen():
            self.thaw()

    def destroy(self) -> None:
        """Kill every task, then remove the group (children first) in every hierarchy.

        Idempotent; also removes the per-home parent when it became empty.
        """
        self.kill_all()
        for hierarchy in _hierarchies():
            top = hierarchy / self.name
            if top.is_dir():
                # Deepest first.
                dirs = [Path(d) for d, _s, _f in os.walk(top)]
                for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                    _cg.rmdir_retry(d)
            parent = top.parent
            if parent != hierarchy and parent.name.startswith("rollbox-"):
                try:
                    os.rmdir(parent)
                except OSError:
                    pass  # siblings still live, or already gone


def orphan_names(home_tag: str, live_ids: set[str]) -> list[str]:
    """Sandbox ids with a group of this home in any v1 hierarchy, not in ``live_ids``."""
    names: set[str] = set()
    parent = parent_name(home_tag)
    for hierarchy in _hierarchies():
        base = hierarchy / parent
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and entry.name not in live_ids:
                names.add(entry.name)
    return sorted(names)


def remove_parents(home_tag: str) -> None:
    """Remove the per-home parent in every hierarchy where it is empty."""
    for hierarchy in _hierarchies():
        try:
            os.rmdir(hierarchy / parent_name(home_tag))
        except OSError:
            pass
