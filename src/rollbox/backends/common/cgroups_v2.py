"""cgroup v2 (unified) groups.

rollbox works below the cgroup it was started in (its *base*, from ``/proc/self/cgroup``):
the root cgroup on a plain host, the unit's cgroup under systemd (``Delegate=yes``) or a
container's cgroup namespace root. It never writes outside the base. Layout::

    <base>/                     cgroup.subtree_control: +cpu +memory +pids +io (what it has)
      rollbox.init/             rollbox itself (and whatever lived in <base>), moved here when
                                <base> is not the root: v2 allows processes in leaves only
      rollbox-<tag>/            per home; subtree_control as <base>
        <sbx-id>/               the sandbox's limits; subtree_control: +pids
          main/                 the sandbox's own processes (launcher, bwrap, agent, runsc)
          box/                  pids.max for commands; every exec's leaf group below it

Pause is ``cgroup.freeze`` (waiting for ``frozen 1`` in ``cgroup.events``), a tree kill is
``cgroup.kill`` (kernel >= 5.14; freeze + SIGKILL loop before that), OOM kills are
``oom_kill`` of ``memory.events`` (hierarchical), refused forks are ``max`` of
``pids.events``.
"""

from __future__ import annotations

import errno
import os
import threading
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
from rollbox.errors import BackendError, BackendUnavailableError, LimitsError
from rollbox.models import Limits

REQUIRED = ("memory", "pids")
"""Controllers a sandbox cannot do without (memory limit + OOM, fork-bomb limit)."""
WANTED = ("cpu", "memory", "pids", "io")
"""Controllers enabled for rollbox's groups when the base has them."""
LEAF = "rollbox.init"
"""Leaf that rollbox moves the base's processes into (no-internal-processes rule)."""
MAIN = "main"
"""Leaf of a sandbox group holding the sandbox's own processes."""
DELEGATE_HINT = "start rollbox in a delegated cgroup: systemd-run --scope -p Delegate=yes rollbox …"

_base_lock = threading.Lock()
_base_ready: dict[str, Path] = {}


def _own_cgroup() -> str:
    """This process's cgroup path in the unified hierarchy (``/`` when at the root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return "/"


def base_dir() -> Path:
    """The cgroup rollbox works below: its own, or the parent of :data:`LEAF` (where an
    earlier rollbox process moved itself and its siblings)."""
    rel = _own_cgroup()
    parts = [p for p in rel.split("/") if p]
    if parts and parts[-1] == LEAF:
        parts.pop()
    return _cg.CGROUP_ROOT.joinpath(*parts)


def is_root(path: Path) -> bool:
    """True for a real root cgroup (exempt from the no-internal-processes rule)."""
    return not (path / "cgroup.type").exists()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def controllers(path: Path) -> set[str]:
    """Controllers available in the group ``path`` (its ``cgroup.controllers``)."""
    return set(_read(path / "cgroup.controllers").split())


def _enable(path: Path, ctrls: list[str]) -> None:
    """Enable ``ctrls`` for the children of ``path`` (no-op for those already on)."""
    missing = [c for c in ctrls if c not in _read(path / "cgroup.subtree_control").split()]
    if missing:
        _write(path / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))


def _move_procs(src: Path, dst: Path) -> None:
    """Move every process of ``src`` (not its children) into ``dst``."""
    for _ in range(100):
        pids = _read(src / "cgroup.procs").split()
        if not pids:
            return
        for pid in pids:
            try:
                _write(dst / "cgroup.procs", pid)
            except OSError as exc:
                if exc.errno != errno.ESRCH:  # exited meanwhile
                    raise


def ensure_base() -> Path:
    """Check and prepare the base once per process: required controllers delegated,
    processes moved to a leaf, the wanted controllers enabled for rollbox's groups.

    Raises:
        BackendUnavailableError: a required controller is not available in the base, or
            the base cannot be prepared (one line naming it and the fix).
    """
    base = base_dir()
    key = str(base)
    if key in _base_ready:
        return base
    with _base_lock:
        if key in _base_ready:
            return base
        avail = controllers(base)
        missing = [c for c in REQUIRED if c not in avail]
        if missing:
            raise BackendUnavailableError(
                f"cgroup v2: the {' and '.join(missing)} controller"
                f"{'s are' if len(missing) > 1 else ' is'} not delegated to rollbox's "
                f"cgroup {base}",
                hint=DELEGATE_HINT,
            )
        want = [c for c in WANTED if c in avail]
        try:
            for attempt in range(20):
                if not is_root(base):
                    leaf = base / LEAF
                    leaf.mkdir(exist_ok=True)
                    _move_procs(base, leaf)
                try:
                    _enable(base, want)
                    break
                except OSError as exc:
                    # A process appeared in the base meanwhile: move it too and retry.
                    if exc.errno != errno.EBUSY or attempt == 19:
                        raise
        except OSError as exc:
            raise BackendUnavailableError(
                f"cgroup v2: cannot enable {' '.join(want)} below {base}: {exc.strerror}",
                hint=DELEGATE_HINT,
            ) from exc
        _base_ready[key] = base
        return base


def available() -> set[str]:
    """Controllers rollbox's groups get here (checks the base first).

    Raises:
        BackendUnavailableError: as :func:`ensure_base`.
    """
    return controllers(ensure_base()) & set(WANTED)


class CgroupV2(Cgroup):
    """One sandbox's (or one exec's) group in the unified hierarchy."""

    version = 2

    @property
    def dir(self) -> Path:
        """The group's directory."""
        return self.paths["pids"]

    @property
    def join_dir(self) -> Path:
        """Where processes go: ``main/`` of a sandbox group, the group itself otherwise."""
        return self.dir / MAIN if self.name.count("/") == 1 else self.dir

    @classmethod
    def _at(cls, name: str, base: Path | None = None) -> CgroupV2:
        d = (base or base_dir()) / name
        return cls(name, dict.fromkeys(CONTROLLERS, d))

    @classmethod
    def create(cls, home_tag: str, sandbox_id: str, limits: Limits) -> CgroupV2:
        """Make ``<base>/rollbox-<tag>/<id>`` (+ ``main/``) and apply ``limits``; see
        :meth:`Cgroup.create`."""
        check_limits(limits)
        avail = available()
        if limits.cpus is not None and "cpu" not in avail:
            raise LimitsError(
                f"cpus={limits.cpus:g} needs the cgroup v2 cpu controller, which is not "
                f"delegated to {base_dir()}",
                hint=f"drop the cpus limit or {DELEGATE_HINT}",
            )
        base = ensure_base()
        parent = base / parent_name(home_tag)
        cg = cls._at(cgroup_name(home_tag, sandbox_id), base)
        try:
            for attempt in range(5):
                try:
                    parent.mkdir(exist_ok=True)
                    _enable(parent, sorted(avail))
                    cg.dir.mkdir()
                    break
                except FileNotFoundError:
                    # A concurrent destroy removed the empty parent between our steps.
                    if attempt == 4:
                        raise
            cg.apply(limits)
            _enable(cg.dir, ["pids"])
            (cg.dir / MAIN).mkdir()
        except OSError as exc:
            cg.destroy()
            raise BackendError(f"cannot create cgroup {cg.name}: {exc}") from exc
        except BaseException:
            cg.destroy()
            raise
        return cg

    @classmethod
    def open(cls, home_tag: str, sandbox_id: str) -> CgroupV2:
        """The existing group of a sandbox (no check that it exists; see :meth:`exists`)."""
        return cls._at(cgroup_name(home_tag, sandbox_id))

    def exists(self) -> bool:
        """True when the group's directory exists."""
        return self.dir.is_dir()

    def _limit(self, file: str, value: str) -> None:
        try:
            _write(self.dir / file, value)
        except OSError as exc:
            raise LimitsError(
                f"the kernel refused {file}={value} for cgroup {self.name}: {exc.strerror}"
            ) from exc

    def apply(self, limits: Limits) -> None:
        """Write ``cpu.max``, ``memory.max`` + ``memory.swap.max = 0`` and ``pids.max``.

        Raises:
            LimitsError: the kernel refused one of them (named).
        """
        if limits.cpus is not None:
            quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
            self._limit("cpu.max", f"{quota} {CPU_PERIOD_US}")
        if limits.memory_mb is not None:
            self._limit("memory.max", str(limits.memory_mb << 20))
            # Without swap accounting the file is absent: nothing can be swapped to it then.
            if (self.dir / "memory.swap.max").exists():
                self._limit("memory.swap.max", "0")
        if limits.pids is not None:
            self._limit("pids.max", str(limits.pids))

    def clear_cpu_limit(self) -> None:
        """``cpu.max = max`` (when the cpu controller is on here)."""
        if (self.dir / "cpu.max").exists():
            self._limit("cpu.max", f"max {CPU_PERIOD_US}")

    def child(
        self,
        name: str,
        controllers: tuple[str, ...] | None = None,
        *,
        pids_max: int | None = None,
    ) -> CgroupV2:
        """A sub-group ``name`` (one directory; ``controllers`` is a v1 notion); see
        :meth:`Cgroup.child`."""
        cg = CgroupV2(f"{self.name}/{name}", dict.fromkeys(CONTROLLERS, self.dir / name))
        try:
            cg.dir.mkdir()
            if pids_max is not None:
                cg._limit("pids.max", str(pids_max))
        except FileExistsError:
            pass
        except OSError as exc:
            cg.destroy()
            raise BackendError(f"cannot create cgroup {cg.name}: {exc}") from exc
        return cg

    def procs_files(self) -> list[Path]:
        """The one ``cgroup.procs`` to join (a sandbox group's ``main/``)."""
        return [self.join_dir / "cgroup.procs"]

    def pids(self) -> list[int]:
        """Every pid in this group and its sub-groups."""
        out: set[int] = set()
        for dirpath, _dirs, _files in os.walk(self.dir):
            out.update(int(x) for x in _read(Path(dirpath, "cgroup.procs")).split())
        return sorted(out)

    def _populated(self) -> bool:
        for line in _read(self.dir / "cgroup.events").splitlines():
            if line.startswith("populated "):
                return line.split()[1] == "1"
        return False

    def remove_if_empty(self) -> bool:
        """rmdir the group when nothing runs in it (or below)."""
        if self._populated():
            return False
        try:
            os.rmdir(self.dir)
        except OSError:
            return False
        return True

    def _frozen_state(self) -> bool | None:
        text = _read(self.dir / "cgroup.events")
        for line in text.splitlines():
            if line.startswith("frozen "):
                return line.split()[1] == "1"
        return None

    def _set_frozen(self, frozen: bool, timeout: float) -> None:
        path = self.dir / "cgroup.freeze"
        try:
            _write(path, "1" if frozen else "0")
        except FileNotFoundError:
            return  # the group is gone: nothing left to freeze or thaw
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            state = self._frozen_state()
            if state is None or state == frozen:
                return
            if time.monotonic() > deadline:
                raise BackendError(
                    f"cgroup {self.name} did not {'freeze' if frozen else 'thaw'} "
                    f"within {timeout:g}s"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def freeze(self, timeout: float = 5.0) -> None:
        """``cgroup.freeze = 1`` and wait for ``frozen 1`` in ``cgroup.events``."""
        self._set_frozen(True, timeout)

    def thaw(self, timeout: float = 5.0) -> None:
        """``cgroup.freeze = 0`` and wait for ``frozen 0``."""
        self._set_frozen(False, timeout)

    def is_frozen(self) -> bool:
        """True when ``cgroup.events`` says ``frozen 1``."""
        return self._frozen_state() is True

    def _event(self, file: str, key: str) -> int:
        for line in _read(self.dir / file).splitlines():
            k, _, value = line.partition(" ")
            if k == key:
                return int(value)
        return 0

    def oom_kills(self) -> int:
        """``oom_kill`` of ``memory.events`` (hierarchical: sub-groups included)."""
        return self._event("memory.events", "oom_kill")

    def pids_max_hits(self) -> int:
        """``max`` of ``pids.events``: kernels with ``pids.events.local`` (6.13+) count
        hierarchically at the limiting group; older ones in the forking task's group,
        so the sub-groups are summed there."""
        if (self.dir / "pids.events.local").exists():
            return self._event("pids.events", "max")
        total = 0
        for dirpath, _dirs, _files in os.walk(self.dir):
            for line in _read(Path(dirpath, "pids.events")).splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    total += int(value)
        return total

    def memory_usage(self) -> int:
        """``memory.current``."""
        try:
            return int(_read(self.dir / "memory.current") or 0)
        except ValueError:
            return 0

    def kill_all(self, timeout: float = 10.0) -> None:
        """``cgroup.kill`` (the kernel kills the whole subtree, forks included); without
        it (kernel < 5.14) freeze + SIGKILL until empty."""
        if not self.dir.is_dir():
            return
        deadline = time.monotonic() + timeout
        try:
            _write(self.dir / "cgroup.kill", "1")
            have_kill = True
        except FileNotFoundError:
            have_kill = False
        delay = 0.0002
        while True:
            pids = self.pids()
            if not pids:
                break
            if not have_kill:
                self.sigkill_frozen(pids)
            if time.monotonic() > deadline:
                raise BackendError(f"cgroup {self.name}: tasks survive SIGKILL: {pids}")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        # A group left frozen keeps later tasks frozen; leave it thawed.
        if self.is_frozen():
            self.thaw()

    def destroy(self) -> None:
        """Kill every task, remove the group deepest first, then the per-home parent if
        it became empty; idempotent."""
        self.kill_all()
        top = self.dir
        if top.is_dir():
            dirs = [Path(d) for d, _s, _f in os.walk(top)]
            for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                _cg.rmdir_retry(d)
        parent = top.parent
        if parent.name.startswith("rollbox-"):
            try:
                os.rmdir(parent)
            except OSError:
                pass  # siblings still live, or already gone

    @property
    def oci_path(self) -> str:
        """The join directory relative to the cgroup2 mount (what runsc expects)."""
        return "/" + str(self.join_dir.relative_to(_cg.CGROUP_ROOT))


def orphan_names(home_tag: str, live_ids: set[str]) -> list[str]:
    """Sandbox ids with a group of this home below the base, not in ``live_ids``."""
    try:
        entries = list(os.scandir(base_dir() / parent_name(home_tag)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(
        e.name for e in entries if e.is_dir(follow_symlinks=False) and e.name not in live_ids
    )


def remove_parents(home_tag: str) -> None:
    """Remove the per-home parent when it is empty."""
    try:
        os.rmdir(base_dir() / parent_name(home_tag))
    except OSError:
        pass
