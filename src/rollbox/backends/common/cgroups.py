"""cgroup v1 groups for sandboxes (this host mounts each v1 controller on its own).

Every sandbox gets ``rollbox-<hometag>/<sandbox-id>`` in each controller of
:data:`CONTROLLERS`; per-exec sub-groups are made with :meth:`Cgroup.child`. The home tag
in the parent's name lets ``rollbox cleanup`` of one home leave other homes alone.
OCI runtimes given ``linux.cgroupsPath = /rollbox-<tag>/<id>`` also create the group in
the other hierarchies (cpuset, devices...), so removal walks every mounted v1 hierarchy.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollbox.errors import BackendError, LimitsError
from rollbox.models import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")

CONTROLLERS: tuple[str, ...] = ("pids", "memory", "cpu", "cpuacct", "freezer", "blkio")
"""The v1 controllers a sandbox's group is made in (each mounted separately here)."""

CPU_PERIOD_US = 100_000
MIN_MEMORY_MB = 8


def _hierarchies() -> list[Path]:
    """Every mounted v1 hierarchy (controllers and named ones), not the unified one."""
    out = []
    try:
        entries = sorted(CGROUP_ROOT.iterdir())
    except FileNotFoundError:
        return []
    for p in entries:
        if p.name == "unified" or p.is_symlink() or not p.is_dir():
            continue
        if (p / "cgroup.procs").exists():
            out.append(p)
    return out


def parent_name(home_tag: str) -> str:
    """Name of the per-home parent group."""
    return f"rollbox-{home_tag}"


def cgroup_name(home_tag: str, sandbox_id: str) -> str:
    """Relative name of a sandbox's group (also its OCI ``cgroupsPath`` without the ``/``)."""
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


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _rmdir_retry(path: Path, attempts: int = 50) -> None:
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


@dataclass
class Cgroup:
    """One sandbox's (or one exec's) group in every v1 controller."""

    name: str
    """Relative path, e.g. ``rollbox-<hometag>/<sbx-id>``."""
    paths: dict[str, Path] = field(default_factory=dict)
    """Controller name -> absolute directory."""

    @classmethod
    def _at(cls, name: str) -> Cgroup:
        return cls(name, {c: CGROUP_ROOT / c / name for c in CONTROLLERS})

    @classmethod
    def create(cls, home_tag: str, sandbox_id: str, limits: Limits) -> Cgroup:
        """Make the sandbox's group in every controller and apply ``limits``.

        Raises:
            LimitsError: the limits cannot be met on this host.
            BackendError: the group could not be made (nothing is left behind).
        """
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
    def open(cls, home_tag: str, sandbox_id: str) -> Cgroup:
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

    def child(self, name: str) -> Cgroup:
        """A sub-group ``name`` in every controller (made now), e.g. one per exec."""
        cg = Cgroup(f"{self.name}/{name}", {c: p / name for c, p in self.paths.items()})
        try:
            cg._mkdirs()
        except OSError as exc:
            cg.destroy()
            raise BackendError(f"cannot create cgroup {cg.name}: {exc}") from exc
        return cg

    def add(self, pid: int) -> None:
        """Move ``pid`` into this group in every controller."""
        for path in self.paths.values():
            _write(path / "cgroup.procs", str(pid))

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
        total = 0
        for dirpath, _dirs, _files in os.walk(self.paths["memory"]):
            try:
                text = Path(dirpath, "memory.oom_control").read_text()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    total += int(value)
        return total

    def pids_max_hits(self) -> int:
        """Forks refused by ``pids.max`` in this group and its sub-groups.

        The v1 kernel counts a refused fork (``max N`` of ``pids.events``) in the forking
        task's own group, so the sub-groups are summed.
        """
        total = 0
        for dirpath, _dirs, _files in os.walk(self.paths["pids"]):
            try:
                text = Path(dirpath, "pids.events").read_text()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    total += int(value)
        return total

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
                    _rmdir_retry(d)
            parent = top.parent
            if parent != hierarchy and parent.name.startswith("rollbox-"):
                try:
                    os.rmdir(parent)
                except OSError:
                    pass  # siblings still live, or already gone


def orphan_cgroups(home_tag: str, live_ids: set[str]) -> list[Cgroup]:
    """Groups of this home whose sandbox id is not in ``live_ids``."""
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
    return [Cgroup.open(home_tag, n) for n in sorted(names)]


def remove_orphan_cgroups(home_tag: str, live_ids: set[str], dry_run: bool) -> list[str]:
    """Destroy (unless ``dry_run``) the orphan groups; one line per group."""
    out = []
    for cg in orphan_cgroups(home_tag, live_ids):
        if not dry_run:
            cg.destroy()
        out.append(f"cgroup {cg.name}")
    if not dry_run:
        for hierarchy in _hierarchies():
            try:
                os.rmdir(hierarchy / parent_name(home_tag))
            except OSError:
                pass
    return out
