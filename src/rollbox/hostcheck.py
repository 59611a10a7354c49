"""What this host offers each backend: the checks behind ``rollbox doctor``.

Read-only: nothing is built, mounted, downloaded or moved (in particular the cgroup v2
base is inspected, not prepared). Each :class:`HostCheck` names the backends that need
it and, when it fails, how to fix it; a backend is ready when every check it needs passes.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rollbox.config import Home

BACKENDS = ("namespace", "gvisor", "microvm")
ALL = list(BACKENDS)
MIN_KERNEL = (5, 4)
"""Oldest kernel the backends are meant for (overlayfs, pidfds, clone3)."""
DELEGATE_FIX = "start rollbox in a delegated cgroup: systemd-run --scope -p Delegate=yes rollbox …"


class HostCheck(BaseModel):
    """One thing a backend needs from the host."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Short name, e.g. ``bwrap``."""
    ok: bool
    """The host has it."""
    detail: str
    """What was found (a version, a path, a mode)."""
    fix: str | None = None
    """How to get it, when it is missing."""
    needed_by: list[str] = []
    """Backends that cannot run without it (empty: optional, information only)."""


class BackendReadiness(BaseModel):
    """Whether one backend can run here."""

    model_config = ConfigDict(extra="forbid")

    ready: bool
    """Every check it needs passes."""
    missing: list[str]
    """Names of the failed checks it needs."""


class HostReport(BaseModel):
    """``rollbox doctor``'s answer."""

    model_config = ConfigDict(extra="forbid")

    kernel: str
    """``uname -r``."""
    cgroup_mode: str
    """``v1``, ``v2`` (unified), ``hybrid`` or ``none``."""
    root: bool
    """Running as root."""
    checks: list[HostCheck]
    """Every check, in a stable order."""
    backends: dict[str, BackendReadiness]
    """Backend name -> readiness."""


def _version_of(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def _tool(name: str, needed_by: list[str], fix: str, version_args: list[str] | None) -> HostCheck:
    path = shutil.which(name)
    if path is None:
        return HostCheck(name=name, ok=False, detail="not found", fix=fix, needed_by=needed_by)
    version = _version_of([path, *version_args]) if version_args else ""
    return HostCheck(name=name, ok=True, detail=f"{path} {version}".strip(), needed_by=needed_by)


def _kernel() -> HostCheck:
    release = platform.release()
    m = re.match(r"(\d+)\.(\d+)", release)
    ok = bool(m) and (int(m.group(1)), int(m.group(2))) >= MIN_KERNEL  # type: ignore[union-attr]
    return HostCheck(
        name="kernel",
        ok=ok,
        detail=release,
        fix=None if ok else f"boot a kernel >= {MIN_KERNEL[0]}.{MIN_KERNEL[1]}",
        needed_by=ALL,
    )


def _cgroups() -> list[HostCheck]:
    from rollbox.backends.common import cgroups

    mode = cgroups.cgroup_mode()
    try:
        version = cgroups.cgroup_version()
    except Exception as exc:
        return [
            HostCheck(
                name="cgroups",
                ok=False,
                detail=str(exc),
                fix=getattr(exc, "hint", None),
                needed_by=ALL,
            )
        ]
    if version == 1:
        root = cgroups.CGROUP_ROOT
        want = ("pids", "memory", "cpu", "cpuacct", "freezer")
        missing = [c for c in want if not (root / c / "cgroup.procs").exists()]
        detail = f"{mode}: v1 controllers {'all mounted' if not missing else 'missing'}"
        if missing:
            detail += f" ({' '.join(missing)})"
        return [
            HostCheck(
                name="cgroups",
                ok=not missing,
                detail=detail + " (rollbox uses the v1 path)",
                fix=f"mount the v1 {' '.join(missing)} controller(s)" if missing else None,
                needed_by=ALL,
            )
        ]
    from rollbox.backends.common import cgroups_v2

    base = cgroups_v2.base_dir()
    have = cgroups_v2.controllers(base)
    need = [c for c in cgroups_v2.REQUIRED if c not in have]
    out = [
        HostCheck(
            name="cgroups",
            ok=not need,
            detail=f"v2: rollbox's cgroup {base} has {' '.join(sorted(have)) or 'no controllers'}",
            fix=DELEGATE_FIX if need else None,
            needed_by=ALL,
        ),
        HostCheck(
            name="cgroup cpu",
            ok="cpu" in have,
            detail="cpu.max for the cpus limit"
            + ("" if "cpu" in have else ": not delegated (sandboxes need cpus=None)"),
            fix=None if "cpu" in have else DELEGATE_FIX,
        ),
        HostCheck(
            name="cgroup.kill",
            ok=(base / "cgroup.kill").exists() or cgroups_v2.is_root(base),
            detail="one-write tree kill (kernel >= 5.14); else freeze + SIGKILL loop",
        ),
    ]
    return out


def _overlay() -> HostCheck:
    try:
        have = "overlay" in Path("/proc/filesystems").read_text()
    except OSError:
        have = False
    if not have:  # a module loads on first mount
        have = subprocess.run(
            ["modinfo", "overlay"], capture_output=True, check=False
        ).returncode == 0 if shutil.which("modinfo") else False  # fmt: skip
    return HostCheck(
        name="overlayfs",
        ok=have,
        detail="available" if have else "not in /proc/filesystems, no module",
        fix=None if have else "a kernel with CONFIG_OVERLAY_FS",
        needed_by=["namespace", "gvisor"],
    )


def _prebuilt(home: Home | None) -> dict[str, bool]:
    """Per backend: every C program it needs is already built for the current sources in
    ``home``'s bin/ (then no compiler is needed, e.g. helpers copied in from a build host)."""
    from rollbox.backends.agent import build
    from rollbox.backends.gvisor import helper
    from rollbox.backends.microvm import initramfs

    def built(source: Path | tuple[Path, ...], name: str, suffix: str = "") -> bool:
        if home is None:
            return False
        return (home.root / "bin" / f"{name}-{build.source_hash(source)}{suffix}").exists()

    agent = built(build.SOURCE, "rollbox-agent")
    return {
        "namespace": agent,
        "gvisor": agent
        and built(helper.SOURCE, "rollbox-uds-listen")
        and built(helper.STATX_SOURCE, "rollbox-statx", ".so"),
        "microvm": built(initramfs.AGENT_SOURCES, "rollbox-guest-agent"),
    }


def _c_toolchain(home: Home | None) -> list[HostCheck]:
    """gcc and the static libc, needed by the backends whose C programs are not built yet."""
    libcs = ("/usr/lib/x86_64-linux-gnu/libc.a", "/usr/lib/libc.a")
    found = [p for p in libcs if Path(p).exists()]
    prebuilt = _prebuilt(home)
    needers = [b for b in BACKENDS if not prebuilt[b]]
    note = "" if not prebuilt or len(needers) == len(BACKENDS) else (
        f"; prebuilt for {', '.join(b for b in BACKENDS if prebuilt[b])}"
    )  # fmt: skip
    gcc = _tool("gcc", needers, "apt-get install gcc libc6-dev", ["--version"])
    gcc.detail += note
    return [
        gcc,
        HostCheck(
            name="static libc",
            ok=bool(found),
            detail=(found[0] if found else "libc.a not found") + note,
            fix=None if found else "apt-get install libc6-dev",
            needed_by=needers,
        ),
    ]


def _seccomp() -> HostCheck:
    lib = ctypes.util.find_library("seccomp")
    return HostCheck(
        name="libseccomp",
        ok=lib is not None,
        detail=lib or "not found",
        fix=None if lib else "apt-get install libseccomp2",
        needed_by=["namespace"],
    )


def _kvm() -> HostCheck:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
        detail = "/dev/kvm opens (a probe guest decides KVM or TCG)"
    except OSError as exc:
        detail = f"/dev/kvm: {exc.strerror}: microVMs run on TCG (slower)"
    return HostCheck(name="kvm", ok=True, detail=detail)


def _guest_kernel(home: Home | None) -> HostCheck:
    root = home.vm / "kernel" if home is not None else None
    cached = [
        d.name for d in (root.iterdir() if root is not None and root.is_dir() else [])
        if (d / ".complete").is_file()
    ]  # fmt: skip
    if cached:
        return HostCheck(
            name="guest kernel", ok=True, detail=f"cached: {cached[0]}", needed_by=["microvm"]
        )
    apt = shutil.which("apt-get") and shutil.which("dpkg-deb")
    return HostCheck(
        name="guest kernel",
        ok=bool(apt),
        detail="downloaded on first use with apt-get" if apt else "no apt-get/dpkg-deb",
        fix=None if apt else "a Debian-family host (apt-get download linux-image-cloud-amd64)",
        needed_by=["microvm"],
    )


def check_host(home: Home | None = None) -> HostReport:
    """Run every check (read-only)."""
    from rollbox.backends.common.cgroups import cgroup_mode

    root = os.geteuid() == 0
    checks = [
        _kernel(),
        HostCheck(
            name="root",
            ok=root,
            detail="euid 0" if root else f"euid {os.geteuid()}",
            fix=None if root else "run rollbox as root (cgroups, overlay mounts, namespaces)",
            needed_by=ALL,
        ),
        *_cgroups(),
        _overlay(),
        _tool("bwrap", ["namespace"], "apt-get install bubblewrap", ["--version"]),
        *_c_toolchain(home),
        _seccomp(),
        _tool("runsc", ["gvisor"], "apt-get install runsc", ["--version"]),
        _tool("qemu-system-x86_64", ["microvm"], "apt-get install qemu-system-x86", ["--version"]),
        _tool("qemu-img", ["microvm"], "apt-get install qemu-utils", ["--version"]),
        _tool("busybox", ["microvm"], "apt-get install busybox-static", None),
        _tool("mkfs.ext4", ["microvm"], "apt-get install e2fsprogs", None),
        _kvm(),
        _guest_kernel(home),
        _tool("mmdebstrap", [], "apt-get install mmdebstrap (the default baseline)", None),
        _tool("buildah", [], "apt-get install buildah (Dockerfile baselines)", ["--version"]),
        _tool("skopeo", [], "apt-get install skopeo (image baselines)", ["--version"]),
    ]
    backends = {}
    for b in BACKENDS:
        missing = [c.name for c in checks if b in c.needed_by and not c.ok]
        backends[b] = BackendReadiness(ready=not missing, missing=missing)
    return HostReport(
        kernel=platform.release(), cgroup_mode=cgroup_mode(), root=root, checks=checks,
        backends=backends,
    )  # fmt: skip
