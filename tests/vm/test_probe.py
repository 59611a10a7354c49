"""Accelerator probe: KVM only when a guest really boots under it; TCG otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.backends.microvm import MicroVMBackend, probe
from rollbox.backends.microvm.defaults import assets_home
from rollbox.backends.microvm.initramfs import ensure_initramfs
from rollbox.backends.microvm.kernel import ensure_kernel
from rollbox.config import Home

pytestmark = pytest.mark.vm


def _assets(home: Home) -> tuple[Path, Path]:
    assets = assets_home(home)
    kernel = ensure_kernel(assets)
    return kernel.vmlinuz, ensure_initramfs(assets, kernel, probe=True)


def test_missing_kvm_device_falls_back_to_tcg(vm_home: Home) -> None:
    vmlinuz, initrd = _assets(vm_home)
    res = probe.probe_kvm(vmlinuz, initrd, device="/nonexistent/kvm", timeout=5)
    assert res.accelerator == "tcg"
    assert "/nonexistent/kvm" in res.reason


def test_guest_that_does_not_boot_in_time_falls_back_to_tcg(vm_home: Home) -> None:
    vmlinuz, initrd = _assets(vm_home)
    res = probe.probe_kvm(vmlinuz, initrd, device="/dev/kvm", timeout=0.05)
    assert res.accelerator == "tcg"
    assert res.seconds < 5


def test_choice_is_cached_per_boot_and_recorded(
    vm_home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLBOX_MICROVM_KVM_DEVICE", "/nonexistent/kvm")
    vmlinuz, initrd = _assets(vm_home)
    scratch = vm_home.root / "probe"
    scratch.mkdir()
    first = probe.choose(scratch, vmlinuz, initrd)
    again = probe.choose(scratch, vmlinuz, initrd)
    assert first.accelerator == again.accelerator == "tcg"
    assert "cached" in again.reason and probe.boot_id() in (scratch / "accel.json").read_text()
    be = MicroVMBackend(vm_home)
    monkeypatch.setenv("ROLLBOX_MICROVM_ACCEL", "tcg")
    assert be.accelerator.accelerator == "tcg"
