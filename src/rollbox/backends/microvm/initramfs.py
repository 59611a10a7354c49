"""The initramfs rollbox boots its guests with: busybox-static, the virtio modules, an init.

The init mounts the baseline disk (serial ``rbxbase``, read-only ext4) and the sandbox's
writable disk (serial ``rbxupper``) as one overlayfs root, moves the agent onto a tmpfs at
``/run/rollbox`` and ``switch_root``s straight into ``python3 agent.py`` as PID 1: no init
system and no probing beyond what the sandbox needs.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
from pathlib import Path

from rollbox.backends.microvm import guest_agent
from rollbox.backends.microvm.kernel import GuestKernel
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

BUSYBOX = Path("/bin/busybox")

INIT = r"""#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in MODULES; do $B insmod /lib/modules/$m.ko; done
fail() { echo "rollbox-init: $*"; $B reboot -f; }
base=; upper=; i=0
while [ -z "$base" ] || [ -z "$upper" ]; do
  for d in /sys/block/vd*; do
    case "$($B cat $d/serial 2>/dev/null)" in
      rbxbase) base=/dev/${d##*/};; rbxupper) upper=/dev/${d##*/};;
    esac
  done
  i=$((i+1)); [ $i -gt 3000 ] && fail "disks did not appear"
  [ -n "$base" ] && [ -n "$upper" ] || $B usleep 1000
done
$B mkdir -p /lower /rw /newroot
$B mount -t ext4 -o ro,noload $base /lower || fail "cannot mount the baseline disk"
$B mount -t ext4 $upper /rw || fail "cannot mount the sandbox disk"
$B mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \
  || fail "cannot mount the overlay root"
[ -e /newroot/usr/bin/python3 ] || fail "NOPYTHON: the baseline has no /usr/bin/python3"
$B mount -t tmpfs -o mode=755,size=16m tmpfs /newroot/run
$B mkdir -p /newroot/run/rollbox/rw /newroot/run/rollbox/lower
$B mount --move /rw /newroot/run/rollbox/rw
$B mount --move /lower /newroot/run/rollbox/lower
$B cp /agent.py /newroot/run/rollbox/agent.py
$B ip link set lo up
$B mount --move /dev /newroot/dev
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
exec $B switch_root /newroot /usr/bin/python3 -I -S /run/rollbox/agent.py
"""

PROBE_INIT = r"""#!/bin/busybox sh
echo ROLLBOX-PROBE-OK
/bin/busybox reboot -f
"""


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A ``newc`` cpio archive of (name, mode, data) entries (char devices: 5,1)."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        nm = name.encode() + b"\0"
        rmaj, rmin = (5, 1) if mode & 0o170000 == 0o20000 else (0, 0)
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmaj, rmin, len(nm), 0]
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + nm)
        out.write(b"\0" * ((4 - (110 + len(nm)) % 4) % 4))
        out.write(data)
        out.write(b"\0" * ((4 - len(data) % 4) % 4))
    return out.getvalue()


def _build(kernel: GuestKernel, init: str) -> bytes:
    if not BUSYBOX.is_file():
        raise BackendUnavailableError(
            "busybox-static is not installed", hint="apt-get install busybox-static"
        )
    mods = kernel.module_paths()
    names = [m.stem for m in mods]
    entries: list[tuple[str, int, bytes]] = [
        (d, 0o40755, b"") for d in ("bin", "dev", "proc", "sys", "lib", "lib/modules")
    ]
    entries.append(("dev/console", 0o20600, b""))
    entries.append(("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    entries.append(("bin/sh", 0o120777, b"busybox"))
    entries.append(("init", 0o100755, init.replace("MODULES", " ".join(names)).encode()))
    entries.append(("agent.py", 0o100644, Path(guest_agent.__file__).read_bytes()))
    for m in mods:
        entries.append((f"lib/modules/{m.name}", 0o100644, m.read_bytes()))
    return _cpio(entries)


def ensure_initramfs(home: Home, kernel: GuestKernel, *, probe: bool = False) -> Path:
    """The initramfs for ``kernel`` (cached by content: kernel, busybox, init and agent).

    With ``probe``, the init only prints a marker and powers off (accelerator probe).
    """
    init = PROBE_INIT if probe else INIT
    key = hashlib.sha256()
    for part in (kernel.version.encode(), init.encode(), Path(guest_agent.__file__).read_bytes()):
        key.update(part)
    key.update(str(BUSYBOX.stat().st_mtime_ns if BUSYBOX.exists() else 0).encode())
    d = home.vm / "initramfs"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{'probe-' if probe else ''}{key.hexdigest()[:16]}.cpio"
    if path.is_file():
        return path
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(_build(kernel, init))
        # kept afterwards: memory snapshots restore with the exact initramfs they booted
        os.rename(tmp, path)
    return path
