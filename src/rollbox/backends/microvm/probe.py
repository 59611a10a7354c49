"""Accelerator probe: KVM only if a tiny guest really boots under it, else TCG.

``/dev/kvm`` opening is not enough: on a nested PVM host stock guests hang in early boot.
So the probe boots the guest kernel with an initramfs that prints a marker and reboots,
under KVM, with a short timeout. The answer is cached per host boot
(``/proc/sys/kernel/random/boot_id``) in ``vm/accel.json``.

Environment overrides (for tests and odd hosts): ``ROLLBOX_MICROVM_ACCEL=kvm|tcg`` forces
one; ``ROLLBOX_MICROVM_KVM_DEVICE`` names the KVM device to check (default ``/dev/kvm``);
``ROLLBOX_MICROVM_PROBE_TIMEOUT`` is the probe's timeout in seconds (default 4).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rollbox.backends.microvm.qemu import QEMU

MARKER = "ROLLBOX-PROBE-OK"
DEFAULT_TIMEOUT = 4.0


@dataclass(frozen=True)
class ProbeResult:
    """The accelerator chosen and why."""

    accelerator: str
    """``kvm`` or ``tcg``."""
    reason: str
    """Why (shown in logs and the sandbox's ``extra``)."""
    seconds: float
    """How long the probe took."""


def boot_id() -> str:
    """This host boot's id."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe_kvm(vmlinuz: Path, initrd: Path, *, device: str, timeout: float) -> ProbeResult:
    """Boot the probe guest under KVM; ``kvm`` only if it printed the marker in time."""
    t0 = time.monotonic()
    if not os.access(device, os.R_OK | os.W_OK):
        return ProbeResult("tcg", f"{device} is not usable", time.monotonic() - t0)
    argv = [
        QEMU, "-M", "microvm,x-option-roms=off,rtc=on,isa-serial=on",
        "-accel", "kvm", "-cpu", "host,-arch-capabilities", "-m", "128", "-smp", "1",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
        "-kernel", str(vmlinuz), "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 reboot=t quiet",
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ProbeResult(
            "tcg", f"a KVM guest did not boot within {timeout:g}s", time.monotonic() - t0
        )
    if MARKER in proc.stdout:
        return ProbeResult("kvm", "a KVM guest booted", time.monotonic() - t0)
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return ProbeResult("tcg", f"KVM guest failed: {err}", time.monotonic() - t0)


def choose(
    vm_dir: Path,
    vmlinuz: Path,
    initrd: Path,
    *,
    accel: str | None = None,
    device: str | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """The accelerator for this host (cached per host boot and probe settings).

    ``accel`` (``kvm``/``tcg`` forces one, ``auto`` probes), ``device`` and ``timeout``
    come from the backend's config (``MicroVMConfig``); ``None`` reads the environment.
    """
    forced = os.environ.get("ROLLBOX_MICROVM_ACCEL") if accel is None else accel
    if forced in ("kvm", "tcg"):
        return ProbeResult(forced, "forced by ROLLBOX_MICROVM_ACCEL or the config", 0.0)
    if device is None:
        device = os.environ.get("ROLLBOX_MICROVM_KVM_DEVICE", "/dev/kvm")
    if timeout is None:
        timeout = float(os.environ.get("ROLLBOX_MICROVM_PROBE_TIMEOUT", DEFAULT_TIMEOUT))
    key = f"{boot_id()}|{device}|{timeout:g}|{vmlinuz}"
    cache = vm_dir / "accel.json"
    try:
        data = json.loads(cache.read_text())
        if data.get("key") == key:
            return ProbeResult(data["accelerator"], data["reason"] + " (cached)", 0.0)
    except (OSError, ValueError, KeyError):
        pass
    result = probe_kvm(vmlinuz, initrd, device=device, timeout=timeout)
    tmp = cache.with_name(f".accel.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, **result.__dict__}))
    os.replace(tmp, cache)
    return result
