"""A listing of the host resources that sandboxes make, to prove nothing leaks.

Tests, ``rollbox run``'s summary, ``rollbox pilot`` and ``rollbox audit`` take a
:class:`HostState` before and after and compare them with :meth:`HostState.diff`.
Only resources that sandboxes could have made are listed: overlay and tmpfs mounts,
cgroups, named network namespaces, veth interfaces, iptables chains and sandbox
runtime processes (bwrap, runc, runsc, qemu), plus the sandbox directories of a home.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_RUNTIME_COMMS = {"bwrap", "runc", "runsc", "runsc-gofer", "runsc-sandbox", "exe"}


def _mounts() -> frozenset[str]:
    out = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split(" ", 1)[0]
            mountpoint = left.split(" ")[4]
            if fstype in {"overlay", "tmpfs", "proc", "sysfs", "ext4", "fuse", "squashfs"}:
                out.add(f"{fstype} {mountpoint}")
    return frozenset(out)


def _cgroups() -> frozenset[str]:
    out = set()
    if not CGROUP_ROOT.is_dir():
        return frozenset()
    for ctrl in CGROUP_ROOT.iterdir():
        try:
            for entry in os.scandir(ctrl):
                if entry.is_dir(follow_symlinks=False) and "rollbox" in entry.name:
                    out.add(f"{ctrl.name}/{entry.name}")
                    for sub in os.scandir(entry.path):
                        if sub.is_dir(follow_symlinks=False):
                            out.add(f"{ctrl.name}/{entry.name}/{sub.name}")
        except OSError:
            continue
    from rollbox.backends.common.cgroups import v2_groups

    return frozenset(out) | v2_groups()


def _netns() -> frozenset[str]:
    try:
        return frozenset(os.listdir("/run/netns"))
    except FileNotFoundError:
        return frozenset()


def _links() -> frozenset[str]:
    try:
        return frozenset(os.listdir("/sys/class/net"))
    except FileNotFoundError:
        return frozenset()


def _iptables_chains() -> frozenset[str]:
    try:
        out = subprocess.run(
            ["iptables", "-w", "-S"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(
        line.split()[1] for line in out.splitlines() if line.startswith("-N ") and "RBX" in line
    )


def _runtime_processes() -> frozenset[str]:
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in _RUNTIME_COMMS or comm.startswith("qemu-system"):
            out.add(f"{pid} {comm}")
    return frozenset(out)


@dataclass(frozen=True)
class HostState:
    """A snapshot of sandbox-related host resources."""

    mounts: frozenset[str] = field(default_factory=frozenset)
    cgroups: frozenset[str] = field(default_factory=frozenset)
    netns: frozenset[str] = field(default_factory=frozenset)
    links: frozenset[str] = field(default_factory=frozenset)
    chains: frozenset[str] = field(default_factory=frozenset)
    processes: frozenset[str] = field(default_factory=frozenset)
    sandbox_dirs: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def capture(cls, sandboxes_dir: Path | None = None) -> HostState:
        """List the host's state now (``sandboxes_dir``: a home's ``sandboxes/``)."""
        dirs: frozenset[str] = frozenset()
        if sandboxes_dir is not None and sandboxes_dir.is_dir():
            dirs = frozenset(os.listdir(sandboxes_dir))
        return cls(
            mounts=_mounts(),
            cgroups=_cgroups(),
            netns=_netns(),
            links=_links(),
            chains=_iptables_chains(),
            processes=_runtime_processes(),
            sandbox_dirs=dirs,
        )

    def diff(self, later: HostState) -> dict[str, list[str]]:
        """What ``later`` has that this state had not (resources that leaked), by kind."""
        out: dict[str, list[str]] = {}
        for name in self.__dataclass_fields__:
            extra = sorted(getattr(later, name) - getattr(self, name))
            if extra:
                out[name] = extra
        return out

    def counts(self) -> dict[str, int]:
        """Number of resources of each kind."""
        return {name: len(getattr(self, name)) for name in self.__dataclass_fields__}
