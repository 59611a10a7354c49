"""What sandboxes of one home left on the host, listed from the host itself.

The home's tag names its cgroups and network namespaces, its path names its mounts, sandbox
directories and runtime command lines: a test with its own home (``linked_home``) can list
everything its sandboxes left, whether or not any record names them.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollbox.config import Home

CGROUP_ROOT = Path("/sys/fs/cgroup")


def home_leftovers(home: Home) -> list[str]:
    """One line per resource of ``home``'s sandboxes still on the host."""
    out: list[str] = []
    group = f"rollbox-{home.tag}"
    for top in [CGROUP_ROOT / group, *CGROUP_ROOT.glob(f"*/{group}")]:
        if top.is_dir():
            out += [f"cgroup {d}" for d in top.iterdir() if d.is_dir()]
    root = str(home.root)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mountpoint = line.split(" ")[4]
            if mountpoint.startswith(root):
                out.append(f"mount {mountpoint}")
    try:
        out += [f"netns {n}" for n in os.listdir("/run/netns") if n.startswith(f"rbx-{home.tag}")]
    except FileNotFoundError:
        pass
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # the TTL reaper is no sandbox resource (it exits once nothing has a TTL)
        if root in cmd and "rollbox.backends.reaper" not in cmd:
            out.append(f"process {pid} {cmd[:120]}")
    vm_runtime = Path("/run/rbx") / home.tag  # microVM sockets (short paths, outside the home)
    if vm_runtime.is_dir():
        out += [f"vm runtime {d}" for d in vm_runtime.iterdir()]
    if home.sandboxes.is_dir():
        out += [f"dir {d}" for d in home.sandboxes.iterdir() if d.name.startswith("sbx-")]
    return out
