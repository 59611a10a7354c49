"""Snapshots of a running microVM sandbox, and fork.

Its filesystem changes become a new baseline; its RAM + devices + frozen disk a memory
snapshot (also how a boot snapshot is saved, see :mod:`.templates`); fork is a memory
snapshot restored ``n`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
from pathlib import Path

from rollbox.backends.base import (
    SandboxHandle,
)
from rollbox.backends.microvm import disk, memfile, qemu
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.defaults import DEFAULT_DISK_MB
from rollbox.backends.microvm.sandbox_base import extra_int, extra_list
from rollbox.backends.microvm.sandbox_files import VMSandboxFiles, safe_extract
from rollbox.errors import (
    BackendError,
    InvalidInputError,
)
from rollbox.ids import new_id
from rollbox.models import (
    SnapshotSource,
)


class VMSandboxSnapshots(VMSandboxFiles):
    """Filesystem and memory snapshots and fork of a microVM sandbox."""

    async def snapshot(self, *, name: str | None = None) -> str:
        """The guest's filesystem changes as a new baseline (parent recorded)."""
        self._usable()
        return await self._fs_snapshot(name)

    async def snapshot_memory(self) -> str:
        """RAM + devices + frozen disk; see :meth:`SandboxHandle.snapshot_memory`."""
        return (await self.memory_snapshot()).id

    async def _fs_snapshot(self, name: str | None) -> str:
        from rollbox.baselines.layers import convert_oci_whiteouts
        from rollbox.baselines.store import BaselineStore

        self.home.tmp.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.home.tmp) as f:
            await self._fetch("fs_diff", "/", f.write)
            f.seek(0)
            with tempfile.TemporaryDirectory(dir=self.home.tmp, prefix="vmsnap-") as stage:
                upper = Path(stage) / "upper"
                upper.mkdir()
                await asyncio.to_thread(safe_extract, f, upper)
                await asyncio.to_thread(convert_oci_whiteouts, upper)
                store = BaselineStore(self.home)
                info = await asyncio.to_thread(
                    store.commit_snapshot,
                    self._info.baseline,
                    upper,
                    SnapshotSource(sandbox_id=self.id, backend="microvm"),
                    name,
                )
        return info.digest

    async def memory_snapshot(self, *, ephemeral: bool = False) -> snaps.MemorySnapshot:
        """Pause, save RAM and devices to a file, freeze the disk, resume.

        Returns:
            The snapshot record (its id restores with ``SandboxSpec.from_snapshot``).
        """
        self._usable()
        async with self._session() as ch:
            await ch.call("quiesce", drop_caches=True)
        return await asyncio.to_thread(self._memory_snapshot_sync, ephemeral)

    def _memory_snapshot_sync(
        self, ephemeral: bool, template_dir: Path | None = None
    ) -> snaps.MemorySnapshot:
        snap_id = new_id("snap")
        sdir = template_dir or snaps.snap_dir(self.home, snap_id)
        sdir.mkdir(parents=True, exist_ok=template_dir is not None)
        vm = self.vm
        index = extra_int(self._info, "disk_index", 0)
        new_disk = self.dir / f"disk-{index + 1}.qcow2"
        mem = sdir / "memory.bin"
        # a boot snapshot's disk gets a unique name: a rebuilt one must never take the path
        # that running sandboxes' overlays name as their backing file
        frozen = sdir / (f"disk-{snap_id}.qcow2" if template_dir else "disk.qcow2")
        ok = False
        try:
            with qemu.QMP(self.rdir / "qmp.sock") as mon:
                mon.execute("stop")
                try:
                    fd = os.open(mem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    try:
                        socket.send_fds(
                            mon.sock,
                            [b'{"execute": "getfd", "arguments": {"fdname": "snap"}}\n'],
                            [fd],
                        )
                        while True:
                            msg = mon._read()
                            if "return" in msg:
                                break
                            if "error" in msg:
                                raise BackendError(f"qemu getfd: {msg['error']}")
                    finally:
                        os.close(fd)
                    mon.execute("migrate", uri="fd:snap")
                    mon.wait_migration()
                    # freeze the disk: the file so far becomes the snapshot's, read-only;
                    # the VM continues on a new overlay stacked on it
                    os.link(vm.disk, frozen)
                    os.chmod(frozen, 0o444)
                    disk.create_overlay(new_disk, frozen, "qcow2", size_mb=self._disk_mb())
                    mon.execute(
                        "blockdev-snapshot-sync",
                        device="upper",
                        **{"snapshot-file": str(new_disk), "format": "qcow2", "mode": "existing"},
                    )
                finally:
                    mon.execute("cont")
            layout, size, sha, ram = self._store_memory(
                mem, sdir, self.backend.vm_config.split_memory
            )
            old_disk = vm.disk
            vm.disk = str(new_disk)
            self._info.extra["vm"] = vm.to_json()
            self._info.extra["disk_index"] = index + 1
            self._save()
            with contextlib.suppress(OSError):
                os.unlink(old_disk)  # the snapshot dir holds the other link
            chain = extra_list(self._info, "snapshot_chain")
            record = snaps.MemorySnapshot(
                id=snap_id,
                source=self.id,
                baseline=self._info.baseline,
                vm=vm.to_json() | {"disk": str(frozen)},
                memory_size=size,
                memory_sha256=sha,
                layout=layout,
                ram_size=ram.ram_size if ram else 0,
                ram_digest=ram.ram_digest if ram else "",
                ram_stat=snaps.fingerprint(sdir / "ram.img") if ram else [],
                disk_mb=self._disk_mb(),
                accelerator=vm.accel,
                kernel=str(self._info.extra.get("kernel", "")),
                chain=chain,
                ephemeral=ephemeral,
                spec=self._info.spec.model_dump(mode="json"),
            )
            snaps.save(self.home, record, sdir)
            if template_dir is None:
                self._info.extra["snapshot_chain"] = [*chain, snap_id]
                self._save()
            ok = True
            return record
        finally:
            if not ok and template_dir is None:
                shutil.rmtree(sdir, ignore_errors=True)
            elif not ok:  # keep older disks of the boot snapshot: sandboxes stack on them
                snaps.remove_memory(sdir)
                with contextlib.suppress(OSError):
                    os.unlink(frozen)

    @staticmethod
    def _store_memory(
        mem: Path, sdir: Path, split: bool
    ) -> tuple[str, int, str, memfile.Split | None]:
        """Split the saved stream into RAM image + state (or keep it whole when the
        splitter does not understand it); returns (layout, stream size, stream sha256,
        split)."""
        if split:
            for name in ("ram.img", "state.bin"):  # a boot snapshot rewritten in place
                with contextlib.suppress(OSError):
                    os.unlink(sdir / name)
            try:
                res = memfile.split(mem, sdir / "ram.img", sdir / "state.bin")
            except memfile.UnsupportedStream:
                pass
            else:
                os.unlink(mem)
                return "split", res.state_size, res.state_sha256, res
        return "stream", mem.stat().st_size, snaps.sha256_file(mem), None

    def _save_template(self, tpl_dir: Path) -> None:
        """Save this freshly booted, not yet configured VM as the boot snapshot later
        creates of the same shape restore from (one writer; others skip)."""
        if (tpl_dir / "meta.json").exists():
            return
        tpl_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(tpl_dir.parent / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            if (tpl_dir / "meta.json").exists():
                return
            # written in place (the running VM's new overlay names the frozen disk by its
            # final path); readers only trust the dir once meta.json, written last, exists
            snaps.remove_memory(tpl_dir)
            self._memory_snapshot_sync(False, template_dir=tpl_dir)
            self._info.extra["boot_snapshot"] = tpl_dir.name
            self._save()

    def _disk_mb(self) -> int:
        return extra_int(self._info, "disk_mb", DEFAULT_DISK_MB)

    async def fork(self, n: int) -> list[SandboxHandle]:
        if n < 1:
            raise InvalidInputError("fork needs n >= 1")
        self._usable()
        snap = await self.memory_snapshot(ephemeral=True)
        try:
            made = await self.backend.restore_many(snap, n, self._info.spec)
        finally:
            # branches keep the frozen disk (and map the RAM image they started from);
            # the memory files are no longer needed
            snaps.remove_memory(snaps.snap_dir(self.home, snap.id))
        return list(made)
