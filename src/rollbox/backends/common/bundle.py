"""OCI runtime-spec ``config.json`` for a sandbox bundle (runc/runsc).

The bundle directory is the sandbox directory: ``rootfs/`` is the overlay mount, the
agent's run dir ``run/`` is bind-mounted at ``/run/rollbox`` and the agent binaries are
bind-mounted read-only. ``/run`` itself is a small tmpfs so the mount points the runtime
creates never land in the overlay upper dir (and so never in snapshots).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollbox.models import Limits

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Docker's default capability set without CAP_MKNOD.
DEFAULT_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]


def oci_config(
    *,
    rootfs: Path,
    args: list[str],
    hostname: str,
    limits: Limits,
    cgroups_path: str | None,
    ro_binds: dict[str, Path],
    rw_binds: dict[str, Path],
    netns_path: Path | None = None,
    env: list[str] | None = None,
    resources: dict[str, Any] | None = None,
    new_netns: bool = True,
) -> dict[str, Any]:
    """A runtime-spec 1.0 config as a dict.

    Args:
        rootfs: the root directory (mounted read-write).
        args: the init process (runs as root, cwd ``/``).
        hostname: the UTS hostname.
        limits: ``nofile`` becomes RLIMIT_NOFILE of the init process (inherited).
        cgroups_path: ``linux.cgroupsPath`` (cgroupfs style ``/a/b``), or ``None``.
        ro_binds: destination -> host path, bind-mounted read-only.
        rw_binds: destination -> host path, bind-mounted read-write.
        netns_path: join this network namespace instead of making a new one.
        env: the init process's environment.
        resources: ``linux.resources`` (leave ``None`` when the cgroup is set up already).
        new_netns: without ``netns_path``: ``True`` for a fresh network namespace,
            ``False`` to stay in the runtime's own (the caller has put it in one).
    """
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/run",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=755", "size=16m"],
        },
    ]
    for dest, src in sorted(rw_binds.items()):
        mounts.append(
            {"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "rw"]}
        )
    for dest, src in sorted(ro_binds.items()):
        mounts.append(
            {"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "ro"]}
        )
    namespaces: list[dict[str, str]] = [
        {"type": "pid"},
        {"type": "ipc"},
        {"type": "uts"},
        {"type": "mount"},
    ]
    if netns_path is not None:
        namespaces.append({"type": "network", "path": str(netns_path)})
    elif new_netns:
        namespaces.append({"type": "network"})
    rlimits = []
    if limits.nofile is not None:
        rlimits.append({"type": "RLIMIT_NOFILE", "hard": limits.nofile, "soft": limits.nofile})
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    }
    if cgroups_path is not None:
        linux["cgroupsPath"] = cgroups_path
    if resources is not None:
        linux["resources"] = resources
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": env or [f"PATH={DEFAULT_PATH}"],
            "cwd": "/",
            "capabilities": {
                k: list(DEFAULT_CAPS) for k in ("bounding", "effective", "permitted", "inheritable")
            },
            "rlimits": rlimits,
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": hostname,
        "mounts": mounts,
        "linux": linux,
    }


def write_bundle(bundle_dir: Path, config: dict[str, Any]) -> Path:
    """Write ``config.json`` into ``bundle_dir``; returns its path."""
    path = bundle_dir / "config.json"
    path.write_text(json.dumps(config, indent=1))
    return path
