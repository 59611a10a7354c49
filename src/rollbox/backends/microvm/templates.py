"""Boot snapshots ("templates") of the microVM backend.

A create restores the snapshot of a freshly booted VM of the same baseline and shape instead
of booting cold (the first create of a shape boots cold and saves it). Here: the key of a
shape and dropping boot snapshots no create can use any more. Saving one is the sandbox's
(:mod:`.sandbox_snapshots`), restoring one :mod:`.lifecycle`'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from rollbox.backends.microvm import qemu
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.backend_base import VMBackendBase
from rollbox.backends.microvm.defaults import assets_home
from rollbox.config import Home
from rollbox.errors import (
    RollboxError,
)


def _open_paths_of_qemus() -> set[str]:
    """Every file path a rollbox QEMU (any home) has open."""
    out: set[str] = set()
    for pid in qemu.find_processes("rbx-").values():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


class VMTemplates(VMBackendBase):
    """Boot snapshots (templates): where each shape's lives, and dropping stale ones."""

    def _template_dir(
        self,
        assets: Home,
        digest: str,
        mem: int,
        cpus: int,
        disk_mb: int,
        initrd: str,
        nic: bool,
    ) -> Path:
        """Where the boot snapshot for this device model and baseline lives."""
        import hashlib
        import json

        from rollbox.backends.microvm.guest_agent import AGENT_VERSION

        key = json.dumps(
            [
                digest,
                mem,
                cpus,
                disk_mb,
                qemu.host_tsc_khz(),
                AGENT_VERSION,
                qemu.BASE_APPEND,
                qemu.tcg_append(self.vm_config.aslr),
                initrd,
                *(["nic"] if nic else []),  # keeps the keys of NIC-less shapes unchanged
            ],
            sort_keys=True,
        )
        return assets.vm / "boot" / hashlib.sha256(key.encode()).hexdigest()[:32]

    def _drop_stale_boot_snapshots(self, dry_run: bool = False) -> list[str]:
        """Boot snapshots no create can use any more: their baseline left the store, or
        they were saved with another initramfs (agent or kernel changed). One whose files a
        running QEMU (of any home sharing these assets) still has open is kept: sandboxes
        stack on its frozen disk."""
        boot = assets_home(self.home).vm / "boot"
        if not boot.is_dir():
            return []
        from rollbox.baselines.store import BaselineStore

        store = BaselineStore(self.home)
        current = ""
        # boot snapshots exist, so the kernel and initramfs were built before: this is cheap
        with contextlib.suppress(RollboxError):
            self.prepare()
            current = str(self._initrd)
        in_use = _open_paths_of_qemus()
        out = []
        for d in sorted(boot.iterdir()):
            try:
                rec = snaps.MemorySnapshot.model_validate_json((d / "meta.json").read_text())
            except (OSError, ValueError):
                continue  # being written (meta.json comes last) or not a boot snapshot
            initrd = str(rec.vm.get("initrd", ""))
            why = ""
            if store.get(rec.baseline) is None:
                why = "its baseline is gone"
            elif current and initrd != current:
                why = "saved with an older guest agent or kernel"
            if not why or any(p.startswith(f"{d}/") for p in in_use):
                continue
            out.append(f"boot snapshot {d.name} ({why})")
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
        return out
