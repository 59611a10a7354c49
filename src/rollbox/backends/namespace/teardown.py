"""Moved to :mod:`rollbox.backends.common.teardown` (shared by namespace, gvisor, microvm)."""

from rollbox.backends.common.teardown import (
    KILL_WAIT_S,
    kill_sandbox,
    remove_cgroup_dirs,
    remove_rootfs,
    why_not_removed,
)

__all__ = ["KILL_WAIT_S", "kill_sandbox", "remove_cgroup_dirs", "remove_rootfs", "why_not_removed"]
