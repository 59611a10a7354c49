"""The initramfs rollbox boots its guests with: busybox-static, the virtio modules, an init.

The init mounts the baseline disk (serial ``rbxbase``, read-only ext4) and the sandbox's
writable disk (serial ``rbxupper``) as one overlayfs root, copies the agent (the static C
binary ``rbx-agent`` and its python file-tree helper ``agent.py``) onto a tmpfs at
``/run/rollbox`` and ``switch_root``s straight into ``rbx-agent`` as PID 1: no init system,
no probing beyond what the sandbox needs, and no python3 needed to boot and exec.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from rollbox.backends.agent.build import compile_c
from rollbox.backends.microvm import guest_agent
from rollbox.backends.microvm.disk import cached_build
from rollbox.backends.microvm.kernel import GuestKernel
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

BUSYBOX = Path("/bin/busybox")
AGENT_SOURCES = tuple(
    Path(guest_agent.__file__).with_name(f)
    for f in (
        "guest_agent.h",
        "guest_agent.c",
        "guest_agent_json.c",
        "guest_agent_exec.c",
        "guest_agent_files.c",
    )
)
"""The C guest agent: its header (hashed) and units (compiled together, as one program)."""


def agent_binary(home: Home) -> Path:
    """The guest agent (static, stripped), compiled once per source into ``home``'s bin/.

    Raises:
        BackendUnavailableError: gcc or the static C library is missing.
    """
    flags = ["-static", "-O2", "-s", "-Wall"]
    return compile_c(home, AGENT_SOURCES, "rollbox-guest-agent", flags)


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
# a minimal baseline (a static binary or busybox, no python3) may lack the mount points
for d in dev proc sys run tmp; do [ -d /newroot/$d ] || $B mkdir -p /newroot/$d; done
$B mount -t tmpfs -o mode=755,size=16m tmpfs /newroot/run
$B mkdir -p /newroot/run/rollbox/rw /newroot/run/rollbox/lower
$B mount --move /rw /newroot/run/rollbox/rw
$B mount --move /lower /newroot/run/rollbox/lower
$B cp /agent.py /rbx-agent /newroot/run/rollbox/
$B ip link set lo up
if [ -e /sys/class/net/eth0 ]; then  # allow-list sandboxes: a NIC to a router netns
  $B ip link set eth0 up
  $B ip addr add GUEST_IP/30 dev eth0
  $B ip route add default via ROUTER_IP
fi
$B mount --move /dev /newroot/dev
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
exec $B switch_root /newroot /run/rollbox/rbx-agent
"""

GUEST_IP, ROUTER_IP = "192.168.127.2", "192.168.127.1"
"""The guest's address on its NIC and the router's (the tap device in the sandbox netns)."""
INIT = INIT.replace("GUEST_IP", GUEST_IP).replace("ROUTER_IP", ROUTER_IP)

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


def _build(kernel: GuestKernel, init: str, agent: bytes) -> bytes:
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
    if agent:
        entries.append(("agent.py", 0o100644, Path(guest_agent.__file__).read_bytes()))
        entries.append(("rbx-agent", 0o100755, agent))
    for m in mods:
        entries.append((f"lib/modules/{m.name}", 0o100644, m.read_bytes()))
    return _cpio(entries)


def ensure_initramfs(home: Home, kernel: GuestKernel, *, probe: bool = False) -> Path:
    """The initramfs for ``kernel`` (cached by content: kernel, busybox, init and agent).

    With ``probe``, the init only prints a marker and powers off (accelerator probe).

    Raises:
        BackendUnavailableError: busybox-static, gcc or the static C library is missing.
    """
    init = PROBE_INIT if probe else INIT
    agent = b"" if probe else agent_binary(home).read_bytes()
    key = hashlib.sha256()
    for part in (kernel.version.encode(), init.encode(), Path(guest_agent.__file__).read_bytes()):
        key.update(part)
    key.update(agent)
    key.update(str(BUSYBOX.stat().st_mtime_ns if BUSYBOX.exists() else 0).encode())
    name = f"{'probe-' if probe else ''}{key.hexdigest()[:16]}.cpio"
    # kept afterwards: memory snapshots record the initramfs they booted with
    return cached_build(
        home.vm / "initramfs" / name, lambda tmp: tmp.write_bytes(_build(kernel, init, agent))
    )
