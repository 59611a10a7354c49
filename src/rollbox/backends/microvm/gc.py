"""Garbage collection of the microVM backend (``rollbox cleanup``).

Sandboxes whose owner died, whose TTL passed or whose QEMU is gone; QEMUs and runtime dirs no
record explains; incomplete and unused snapshots; stale boot snapshots; and the home's orphaned
cgroups and networks.
"""

from __future__ import annotations

import shutil

from rollbox.backends.microvm import qemu
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.sandbox_base import extra_list
from rollbox.backends.microvm.templates import VMTemplates
from rollbox.backends.state import (
    expired,
    list_states,
    owner_gone,
    sandbox_dir,
)
from rollbox.errors import (
    TeardownError,
)


class VMGarbageCollector(VMTemplates):
    """Removing what dead, expired or orphaned microVM sandboxes left."""

    def _drop_unused_snapshots(self, dry_run: bool = False) -> list[str]:
        """Ephemeral (fork) snapshots that no sandbox and no other snapshot uses."""
        used: set[str] = set()
        for info in list_states(self.home, self.name):
            used.update(extra_list(info, "snapshot_chain"))
        records = snaps.all_snapshots(self.home)
        for rec in records:
            used.update(rec.chain)
        out = []
        for rec in records:
            if rec.ephemeral and rec.id not in used:
                if not dry_run:
                    snaps.remove(self.home, rec.id)
                out.append(f"fork snapshot {rec.id}")
        return out

    def cleanup_orphans(self, *, dry_run: bool = False) -> list[str]:
        out: list[str] = []
        errors: list[str] = []
        live: set[str] = set()
        for info in self.list_sandboxes():
            pid = info.extra.get("qemu_pid")
            vm_name = qemu.proc_name(self.home.tag, info.id)
            dead = info.state in ("destroyed", "crashed") or (
                info.state != "creating"
                and not qemu.alive(pid if isinstance(pid, int) else None, vm_name)
            )
            if dead or owner_gone(info) or expired(info):
                why = (
                    "expired" if expired(info) else "owner gone" if owner_gone(info) else "VM gone"
                )
                if dry_run:
                    out.append(f"sandbox {info.id} ({why})")
                else:
                    try:
                        out += [f"{r} ({why})" for r in self.destroy_by_id(info.id)]
                    except TeardownError as exc:  # reported, not counted as removed
                        out += [f"{r} ({why})" for r in exc.removed]
                        errors += exc.errors
            else:
                live.add(info.id)
        # QEMUs and runtime dirs of this home that no sandbox record explains
        prefix = qemu.proc_name(self.home.tag, "")
        for name, pid in qemu.find_processes(prefix).items():
            sid = name[len(prefix) :]
            if sid not in live and not sandbox_dir(self.home, sid).exists():
                out.append(f"process {pid} ({name})")
                if not dry_run:
                    qemu.kill(pid, name)
        tag_dir = qemu.RUN_ROOT / self.home.tag
        if tag_dir.is_dir():
            for entry in tag_dir.iterdir():
                if entry.name not in live and not sandbox_dir(self.home, entry.name).exists():
                    out.append(f"runtime dir {entry}")
                    if not dry_run:
                        shutil.rmtree(entry, ignore_errors=True)
        sroot = snaps.root(self.home)
        if sroot.is_dir():
            for entry in sroot.iterdir():
                if not (entry / "meta.json").exists():
                    out.append(f"incomplete snapshot {entry}")
                    if not dry_run:
                        shutil.rmtree(entry, ignore_errors=True)
        out += self._drop_unused_snapshots(dry_run)
        out += self._drop_stale_boot_snapshots(dry_run)
        from rollbox.backends.common.cgroups import remove_orphan_cgroups

        # keep every live sandbox's group, of any backend (they share the home's parent)
        everyone = live | {i.id for i in list_states(self.home) if i.backend != self.name}
        out += remove_orphan_cgroups(self.home.tag, everyone, dry_run)
        from rollbox.backends.common.network import remove_orphan_networks

        out += remove_orphan_networks(self.home.tag, everyone, dry_run)
        if errors:
            raise TeardownError(
                f"cleanup of {self.name} sandboxes left {len(errors)} resource(s)",
                errors=errors,
                removed=out,
            )
        return out
