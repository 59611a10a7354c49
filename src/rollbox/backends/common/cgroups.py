"""Sandbox cgroups behind one interface, whatever cgroup version the host runs.

Every sandbox gets ``rollbox-<hometag>/<sandbox-id>``; per-exec sub-groups are made with
:meth:`Cgroup.child`. The home tag in the parent's name lets ``rollbox cleanup`` of one
home leave other homes alone. :meth:`Cgroup.create` and :meth:`Cgroup.open` pick the
implementation for this host:

- **v1 and hybrid** hosts (v1 controllers mounted, maybe an empty unified mount beside
  them): :class:`~rollbox.backends.common.cgroups_v1.CgroupV1`, one directory per v1
  controller.
- **v2** (unified) hosts: :class:`~rollbox.backends.common.cgroups_v2.CgroupV2`, one
  directory under the cgroup rollbox was started in (its delegated subtree).

Callers use only the methods below (``paths`` maps every v1 controller name to a directory
on both versions, so a file with the same name and format on both, e.g. ``pids.events``,
can be read through it).
"""

from __future__ import annotations

import os

from rollbox.backends.common import cgroup_base, cgroups_v1, cgroups_v2
from rollbox.backends.common.cgroup_base import (
    CGROUP_ROOT,
    CONTROLLERS,
    CPU_PERIOD_US,
    MIN_MEMORY_MB,
    Cgroup,
    CgroupMode,
    cgroup_mode,
    cgroup_name,
    cgroup_version,
    check_limits,
    parent_name,
    register,
)
from rollbox.errors import BackendUnavailableError

__all__ = [
    "CGROUP_ROOT",
    "CONTROLLERS",
    "CPU_PERIOD_US",
    "MIN_MEMORY_MB",
    "Cgroup",
    "CgroupMode",
    "cgroup_mode",
    "cgroup_name",
    "cgroup_version",
    "check_limits",
    "orphan_cgroups",
    "parent_name",
    "remove_orphan_cgroups",
    "require_cgroups",
    "v2_groups",
]

register(1, cgroups_v1.CgroupV1)
register(2, cgroups_v2.CgroupV2)


def orphan_cgroups(home_tag: str, live_ids: set[str]) -> list[Cgroup]:
    """Groups of this home whose sandbox id is not in ``live_ids``."""
    impl = cgroups_v1 if cgroup_version() == 1 else cgroups_v2
    return [Cgroup.open(home_tag, n) for n in impl.orphan_names(home_tag, live_ids)]


def remove_orphan_cgroups(home_tag: str, live_ids: set[str], dry_run: bool) -> list[str]:
    """Destroy (unless ``dry_run``) the orphan groups; one line per group."""
    try:
        version = cgroup_version()
    except BackendUnavailableError:
        return []
    out = []
    for cg in orphan_cgroups(home_tag, live_ids):
        if not dry_run:
            cg.destroy()
        out.append(f"cgroup {cg.name}")
    if not dry_run:
        (cgroups_v1 if version == 1 else cgroups_v2).remove_parents(home_tag)
    return out


def require_cgroups() -> None:
    """Check that sandboxes can get cgroups here (backends call this in ``prepare()``).

    Raises:
        BackendUnavailableError: one line naming what is missing and how to get it.
    """
    if cgroup_version() == 2:
        cgroups_v2.ensure_base()


def v2_groups() -> frozenset[str]:
    """On a v2 host: ``v2:<path>`` of every per-home parent and sandbox group below
    rollbox's base (for leak checks; v1 hierarchies are listed by the caller). Reads
    only: the base is not prepared."""
    try:
        if cgroup_version() != 2:
            return frozenset()
    except BackendUnavailableError:
        return frozenset()
    out: set[str] = set()
    base = cgroups_v2.base_dir()
    try:
        parents = [e for e in os.scandir(base) if e.name.startswith("rollbox-") and e.is_dir()]
    except OSError:
        return frozenset()
    for parent in parents:
        rel = os.path.relpath(parent.path, cgroup_base.CGROUP_ROOT)
        out.add(f"v2:{rel}")
        try:
            out.update(f"v2:{rel}/{e.name}" for e in os.scandir(parent.path) if e.is_dir())
        except OSError:
            continue
    return frozenset(out)
