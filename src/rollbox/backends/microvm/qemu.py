"""QEMU ``microvm`` command lines, the detached QEMU process and its QMP monitor.

QEMU runs detached (``-daemonize``), so a sandbox outlives the process that created it;
its sockets (QMP monitor, agent channel) live under a short runtime dir
``/run/rbx/<home-tag>/<sandbox-id>/`` (unix socket paths are limited to 108 bytes).
The process is named ``rbx-<home-tag>-<sandbox-id>`` (``-name``), which is how cleanup
finds QEMUs of one home and never touches another home's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.errors import BackendError, BackendUnavailableError

QEMU = "qemu-system-x86_64"
RUN_ROOT = Path("/run/rbx")
AGENT_PORT = "rollbox.agent"
RAM_ID = "microvm.ram"
"""QEMU's name for a microvm's RAM block (and our memory backend object)."""
TB_MB = int(os.environ.get("ROLLBOX_MICROVM_TB_MB", "32"))
"""TCG translation cache per VM (MiB), the largest part of QEMU's own memory once the guest
has run much code. Measured here (benchmarks/README.md): an idle restored VM uses ~37 MiB
beyond guest RAM either way (only touched cache pages count); after a Python-heavy exec
58 MiB with 32 vs 40 MiB with 16, but 16 runs that Python 1.9x slower and a boot-snapshot
create 1.4x slower. 16 trades speed for density; 8 is 3x slower."""

# TCG: the kernel's PIT calibration fails on a busy host (the vCPU thread is descheduled
# mid-loop) and boot then hangs; give it the TSC and LAPIC timer rates instead of probing.
TCG_BASE_APPEND = "tsc=reliable lapic_timer_period=4000000 no_timer_check"
TCG_APPEND = TCG_BASE_APPEND
# TCG keys its translated code by guest virtual address, so with ASLR every new process
# (ld.so, libc at fresh addresses) is translated from scratch: measured here, fork+exec of
# /bin/true 40 -> 10 ms and `python3 -c pass` 400 -> 100 ms without it. The VM, not ASLR,
# is the boundary between rollouts; ROLLBOX_MICROVM_ASLR=1 keeps guest ASLR on under TCG.
ASLR = os.environ.get("ROLLBOX_MICROVM_ASLR", "0") == "1"
if not ASLR:
    TCG_APPEND += " norandmaps"


def tcg_append(aslr: bool) -> str:
    """The TCG guests' extra kernel arguments (``norandmaps`` unless ``aslr``)."""
    return TCG_BASE_APPEND if aslr else f"{TCG_BASE_APPEND} norandmaps"


BASE_APPEND = (
    "console=ttyS0 panic=-1 reboot=t quiet loglevel=1 cryptomgr.notests "
    "i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd random.trust_cpu=on "
    "audit=0 apparmor=0 selinux=0 ima_appraise=off "
    # freed pages are zeroed, so a memory snapshot (zero pages cost nothing) holds only
    # live data: ~30% smaller files and faster restores
    "init_on_free=1"
)


def host_tsc_khz() -> int:
    """The host's TSC rate in kHz (TCG's guest TSC follows the host's)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError):
        pass
    return 2_000_000


def version() -> str:
    """``qemu 7.2.x``.

    Raises:
        BackendUnavailableError: QEMU is not installed.
    """
    try:
        out = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=True)
    except (FileNotFoundError, subprocess.CalledProcessError):
        raise BackendUnavailableError(
            f"{QEMU} is not installed", hint="apt-get install qemu-system-x86 qemu-utils"
        ) from None
    first = out.stdout.splitlines()[0] if out.stdout else "unknown"
    return "qemu " + first.split("version")[-1].strip().split()[0]


def run_dir(tag: str, sandbox_id: str) -> Path:
    """The runtime dir holding a sandbox's sockets."""
    return RUN_ROOT / tag / sandbox_id


def proc_name(tag: str, sandbox_id: str) -> str:
    """The ``-name`` of a sandbox's QEMU."""
    return f"rbx-{tag}-{sandbox_id}"


@dataclass
class VMConfig:
    """Everything that determines a VM's device model (must match for a memory restore)."""

    name: str
    accel: str
    memory_mb: int
    cpus: int
    kernel: str
    initrd: str
    base_image: str
    disk: str
    run_dir: str
    console_log: str
    extra_append: str = ""
    tsc_khz: int = field(default_factory=host_tsc_khz)
    mem_file: str = ""
    """A split snapshot's RAM image to map copy-on-write as guest RAM ("" = anonymous)."""
    nic: bool = False
    """A virtio-net NIC on the tap device ``tap0`` (allow-list sandboxes)."""
    netns: str = ""
    """The network namespace QEMU runs in (holds ``tap0``); "" = the host's."""
    tb_mb: int = TB_MB
    """TCG translation cache (MiB); see :data:`TB_MB`."""
    aslr: bool = ASLR
    """Keep guest ASLR on under TCG; see :data:`TCG_APPEND`."""

    def argv(self, *, incoming: str | None = None) -> list[str]:
        """The QEMU command line (``incoming``: restore from that migration URI, paused)."""
        rd = Path(self.run_dir)
        append = BASE_APPEND
        if self.accel == "tcg":
            append += f" {tcg_append(self.aslr)} tsc_early_khz={self.tsc_khz}"
        if self.extra_append:
            append += " " + self.extra_append
        accel = ["-accel", f"tcg,thread=multi,tb-size={self.tb_mb}", "-cpu", "max"]
        if self.accel == "kvm":
            accel = ["-accel", "kvm", "-cpu", "host,-arch-capabilities"]
        # a restore needs no kernel: QEMU would hold kernel + initrd (~13 MB) in memory for
        # the VM's lifetime only to serve them to a firmware that never runs again
        boot = ["-kernel", self.kernel, "-initrd", self.initrd, "-append", append]
        if incoming:
            boot = []
        machine = "microvm,x-option-roms=off,rtc=on,isa-serial=on"
        memory: list[str] = []
        if self.mem_file:
            # same RAM block name as QEMU's default RAM, so a stream saved from an anonymous
            # guest restores onto the file; share=off: MAP_PRIVATE, the file is never written
            machine += f",memory-backend={RAM_ID}"
            memory = ["-object", f"memory-backend-file,id={RAM_ID},size={self.memory_mb}M,"
                      f"mem-path={self.mem_file},share=off"]  # fmt: skip
        nic = []
        if self.nic:
            nic = ["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
                   "-device", "virtio-net-device,netdev=n0"]  # fmt: skip
        argv = [
            QEMU,
            "-name", f"{self.name},debug-threads=off",
            "-M", machine,
            *memory,
            *accel,
            "-m", str(self.memory_mb),
            "-smp", str(self.cpus),
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
            "-serial", f"file:{self.console_log}",
            *boot,
            "-drive", f"id=base,file={self.base_image},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=base,serial=rbxbase",
            "-drive", f"id=upper,file={self.disk},format=qcow2,if=none,discard=unmap",
            "-device", "virtio-blk-device,drive=upper,serial=rbxupper",
            "-device", "virtio-serial-device,max_ports=2",
            "-chardev", f"socket,id=agent,path={rd / 'agent.sock'},server=on,wait=off",
            "-device", f"virtserialport,chardev=agent,name={AGENT_PORT}",
            *nic,
            "-qmp", f"unix:{rd / 'qmp.sock'},server=on,wait=off",
            "-pidfile", str(rd / "qemu.pid"),
            "-daemonize",
        ]  # fmt: skip
        if incoming is not None:
            argv += ["-S", "-incoming", incoming]
        return argv

    def to_json(self) -> dict[str, Any]:
        """Plain data for state/snapshot records."""
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VMConfig:
        """Inverse of :meth:`to_json`."""
        return cls(**data)


def start(cfg: VMConfig, *, incoming: str | None = None, pass_fds: tuple[int, ...] = ()) -> int:
    """Start QEMU detached; returns its pid once its sockets exist.

    Raises:
        BackendError: QEMU refused to start (its message included).
    """
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    argv = cfg.argv(incoming=incoming)
    if cfg.netns:  # only the network namespace changes (nsenter execs QEMU)
        argv = ["nsenter", f"--net=/run/netns/{cfg.netns}", *argv]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    if proc.returncode != 0:
        raise BackendError(f"qemu failed to start: {proc.stderr.strip()[-500:]}")
    return int((Path(cfg.run_dir) / "qemu.pid").read_text().strip())


def alive(pid: int | None, name: str) -> bool:
    """True when ``pid`` is a live QEMU named ``name`` (guards against pid reuse)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and f"{name},".encode() in cmdline


def kill(pid: int | None, name: str, timeout: float = 5.0) -> None:
    """SIGKILL the QEMU and wait until it is gone."""
    if not alive(pid, name):
        return
    assert pid is not None
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid, name) and time.monotonic() < deadline:
        time.sleep(0.01)


def find_processes(prefix: str) -> dict[str, int]:
    """Live QEMUs whose ``-name`` starts with ``prefix``: name -> pid."""
    out: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(QEMU.encode()):
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"-name":
                name = argv[i + 1].decode(errors="replace").split(",")[0]
                if name.startswith(prefix):
                    out[name] = int(entry)
    return out


class QMP:
    """A minimal blocking QMP client (one command at a time)."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except OSError as exc:
            self.sock.close()
            raise BackendError(f"cannot reach the QEMU monitor at {path}: {exc}") from None
        self.buf = b""
        self._read()  # greeting
        self.execute("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise BackendError("the QEMU monitor closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        msg: dict[str, Any] = json.loads(line)
        return msg

    def execute(self, cmd: str, **args: Any) -> Any:
        """Run ``cmd``; returns its ``return`` value.

        Raises:
            BackendError: QEMU answered with an error.
        """
        req: dict[str, Any] = {"execute": cmd}
        if args:
            req["arguments"] = args
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        while True:
            msg = self._read()
            if "return" in msg:
                return msg["return"]
            if "error" in msg:
                raise BackendError(f"qemu {cmd}: {msg['error'].get('desc', msg['error'])}")

    def wait_migration(self, timeout: float = 120.0) -> dict[str, Any]:
        """Poll ``query-migrate`` until the migration completed.

        Raises:
            BackendError: it failed or took longer than ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            info: dict[str, Any] = self.execute("query-migrate")
            status = info.get("status")
            if status == "completed":
                return info
            if status in ("failed", "cancelled"):
                raise BackendError(f"migration {status}: {info.get('error-desc', '')}")
            if time.monotonic() > deadline:
                raise BackendError("migration timed out")
            time.sleep(0.005)

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()

    def __enter__(self) -> QMP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
