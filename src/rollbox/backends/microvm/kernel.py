"""The guest kernel: Debian's ``linux-image-cloud-amd64``, unpacked under ``ROLLBOX_HOME``.

The package is fetched with ``apt-get download`` (never installed on the host) and unpacked
with ``dpkg-deb -x`` into ``$ROLLBOX_HOME/vm/kernel/<version>/``. The version is recorded on
every sandbox (provenance).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

META_PACKAGE = "linux-image-cloud-amd64"

# Loaded in this order by the initramfs init (each depends on the ones before it).
MODULES = [
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/block/virtio_blk.ko",
    "drivers/char/virtio_console.ko",
    "fs/overlayfs/overlay.ko",
    # the NIC of allow-list sandboxes (virtio_net needs net_failover, which needs failover)
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
]


@dataclass(frozen=True)
class GuestKernel:
    """An unpacked guest kernel."""

    version: str
    """Kernel release, e.g. ``6.1.0-57-cloud-amd64``."""
    package_version: str
    """Debian package version, e.g. ``6.1.192-3``."""
    vmlinuz: Path
    """The kernel image QEMU boots."""
    modules_dir: Path
    """``lib/modules/<version>/kernel``."""

    def module_paths(self) -> list[Path]:
        """The virtio/overlay modules, in load order."""
        return [self.modules_dir / m for m in MODULES]


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise BackendUnavailableError(
            f"{cmd[0]} is not installed", hint="the microvm backend needs apt and dpkg"
        ) from None
    if proc.returncode != 0:
        raise BackendUnavailableError(
            f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}",
            hint="run 'apt-get update' so the guest kernel package can be downloaded",
        )
    return proc.stdout


def _dependency() -> str:
    """The versioned kernel package the meta package depends on."""
    out = _run(["apt-cache", "depends", META_PACKAGE])
    m = re.search(r"Depends:\s*(linux-image-[0-9][^\s]*-cloud-amd64)", out)
    if not m:
        raise BackendUnavailableError(
            f"cannot find the kernel package {META_PACKAGE} depends on",
            hint="run 'apt-get update'",
        )
    return m.group(1)


def _find_existing(root: Path) -> GuestKernel | None:
    if not root.is_dir():
        return None
    for d in sorted(root.iterdir(), reverse=True):
        k = _load(d)
        if k is not None:
            return k
    return None


def _load(d: Path) -> GuestKernel | None:
    done = d / ".complete"
    if not done.is_file():
        return None
    pkg_version = done.read_text().strip()
    vmlinuz = d / "boot" / f"vmlinuz-{d.name}"
    modules = d / "lib" / "modules" / d.name / "kernel"
    if not vmlinuz.is_file() or not modules.is_dir():
        return None
    return GuestKernel(d.name, pkg_version, vmlinuz, modules)


def ensure_kernel(home: Home) -> GuestKernel:
    """The guest kernel, downloaded and unpacked on first use (cached afterwards).

    Raises:
        BackendUnavailableError: the package cannot be downloaded or unpacked.
    """
    root = home.vm / "kernel"
    found = _find_existing(root)
    if found is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _find_existing(root)
        if found is not None:
            return found
        package = _dependency()
        version = package.removeprefix("linux-image-")
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            tmpdir = Path(tmp)
            _run(["apt-get", "download", "-q", package], cwd=tmpdir)
            debs = list(tmpdir.glob("*.deb"))
            if not debs:
                raise BackendUnavailableError(f"apt-get download {package} produced no .deb")
            pkg_version = debs[0].name.split("_")[1]
            unpack = tmpdir / version
            _run(["dpkg-deb", "-x", str(debs[0]), str(unpack)])
            (unpack / ".complete").write_text(pkg_version + "\n")
            dest = root / version
            if dest.exists():
                shutil.rmtree(dest)
            os.rename(unpack, dest)
        kernel = _load(root / version)
        if kernel is None:
            raise BackendUnavailableError(f"unpacked {package} lacks a kernel or its modules")
        return kernel
