"""Creating, restoring, attaching and destroying microVM sandboxes.

A create boots cold or restores a boot snapshot (:mod:`.templates`); a restore loads a memory
snapshot (a user's or a fork's) into a fresh QEMU, checking its digest as it streams in. Each
QEMU runs in the sandbox's host cgroup.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from rollbox.backends.base import (
    SandboxHandle,
)
from rollbox.backends.common.teardown import why_not_removed
from rollbox.backends.microvm import disk, memfile, qemu
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.channel import ChannelClosed
from rollbox.backends.microvm.defaults import (
    DEFAULT_DISK_MB,
    GUEST_OVERHEAD_MB,
    PIPE_BYTES,
    assets_home,
)
from rollbox.backends.microvm.gc import VMGarbageCollector
from rollbox.backends.microvm.net import setup_vm_network, teardown_vm_network
from rollbox.backends.microvm.sandbox import MicroVMSandbox
from rollbox.backends.state import (
    read_state,
    sandbox_dir,
    write_state,
)
from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    CorruptionError,
    SandboxCrashedError,
    SandboxNotFoundError,
    TeardownError,
)
from rollbox.ids import new_id
from rollbox.models import (
    BaselineInfo,
    Limits,
    SandboxInfo,
    SandboxSpec,
)


def _host_cgroup(home: Home, sandbox_id: str, spec: SandboxSpec, pid: int) -> None:
    """Put the QEMU process in the sandbox's host cgroup ``rollbox-<tag>/<id>``: its CPU
    quota is the sandbox's ``cpus`` (fractions hold for VMs too), and leak checks and
    ``rollbox cleanup`` see the VM like any other sandbox's processes."""
    from rollbox.backends.common.cgroups import Cgroup

    lim = Limits(cpus=spec.limits.cpus, memory_mb=None, pids=None, disk_mb=None, nofile=None)
    cg = Cgroup.create(home.tag, sandbox_id, lim)
    cg.add(pid)


def _drop_host_cgroup(home: Home, sandbox_id: str) -> bool:
    from rollbox.backends.common.cgroups import Cgroup

    cg = Cgroup.open(home.tag, sandbox_id)
    if not cg.exists():
        return False
    cg.destroy()
    return True


def _configure_args(spec: SandboxSpec, full_command_caps: bool = False) -> dict[str, Any]:
    return {
        "hostname": spec.hostname,
        "memory_max": (spec.limits.memory_mb or 0) << 20,
        "pids_max": spec.limits.pids,
        "full_command_caps": full_command_caps,
    }


class VMLifecycle(VMGarbageCollector):
    """Creating, restoring, attaching and destroying microVM sandboxes."""

    async def create(self, spec: SandboxSpec, baseline: BaselineInfo) -> SandboxHandle:
        self.check(spec)
        if spec.from_snapshot:
            snap = snaps.load(self.home, spec.from_snapshot)
            return (await self.restore_many(snap, 1, spec))[0]
        self.prepare()
        assert self._kernel is not None and self._initrd is not None
        from rollbox.baselines.store import BaselineStore

        layers = BaselineStore(self.home).layer_dirs(baseline.digest)
        assets = assets_home(self.home)
        base = await asyncio.to_thread(disk.ensure_base_image, assets, baseline.digest, layers)
        disk_mb = spec.limits.disk_mb or DEFAULT_DISK_MB
        template = await asyncio.to_thread(disk.ensure_upper_template, assets, disk_mb)
        mem = (spec.limits.memory_mb or 1024) + GUEST_OVERHEAD_MB
        accel = self.accelerator
        cpus = max(1, math.ceil(spec.limits.cpus or 1))
        nic = spec.network.mode == "allow"
        tpl_dir = self._template_dir(
            assets, baseline.digest, mem, cpus, disk_mb, str(self._initrd), nic
        )
        if self.vm_config.boot_snapshots and (tpl_dir / "meta.json").is_file():
            try:
                rec = snaps.MemorySnapshot.model_validate_json((tpl_dir / "meta.json").read_text())
                return await self._restore(rec, spec, template=(tpl_dir, baseline))
            except CorruptionError:
                # rebuilt by this cold boot; its disk stays (running sandboxes stack on it)
                with contextlib.suppress(OSError):
                    os.unlink(tpl_dir / "meta.json")
                snaps.remove_memory(tpl_dir)
        sid = new_id("sbx")
        info = self._new_info(spec, baseline.digest, sid)
        d = sandbox_dir(self.home, sid)
        d.mkdir(parents=True)
        rdir = qemu.run_dir(self.home.tag, sid)
        vm = qemu.VMConfig(
            name=qemu.proc_name(self.home.tag, sid),
            accel=accel.accelerator,
            memory_mb=mem,
            cpus=cpus,
            kernel=str(self._kernel.vmlinuz),
            initrd=str(self._initrd),
            base_image=str(base),
            disk=str(d / "disk-0.qcow2"),
            run_dir=str(rdir),
            console_log=str(d / "console.log"),
            nic=nic,
            tb_mb=self.vm_config.tb_mb,
            aslr=self.vm_config.aslr,
        )
        info.accelerator = accel.accelerator
        info.extra.update(
            run_dir=str(rdir),
            vm=vm.to_json(),
            disk_index=0,
            disk_mb=disk_mb,
            kernel=self._kernel.version,
            kernel_package=self._kernel.package_version,
            accelerator_reason=accel.reason,
            image_env=list(baseline.config.env),
            image_workdir=baseline.config.workdir,
            image_user=baseline.config.user,
        )
        write_state(self.home, info)
        handle = MicroVMSandbox(self, info)
        try:
            if nic:
                net = await asyncio.to_thread(setup_vm_network, self.home, sid, spec)
                info.extra["net"] = net
                vm.netns = net["netns"]
                info.extra["vm"] = vm.to_json()
                write_state(self.home, info)
            await asyncio.to_thread(disk.create_overlay, Path(vm.disk), template, "raw")
            info.extra["qemu_pid"] = pid = await asyncio.to_thread(qemu.start, vm)
            write_state(self.home, info)
            await asyncio.to_thread(_host_cgroup, self.home, sid, spec, pid)
            async with handle._session(timeout=self.vm_config.boot_timeout_s) as ch:
                if self.vm_config.boot_snapshots and not (tpl_dir / "meta.json").exists():
                    await ch.call("quiesce", drop_caches=True)
            if self.vm_config.boot_snapshots:
                await asyncio.to_thread(handle._save_template, tpl_dir)
            async with handle._session(timeout=self.vm_config.boot_timeout_s) as ch:
                await ch.call("configure", **_configure_args(spec, self.full_command_caps))
            info.state = "running"
            write_state(self.home, info)
        except BaseException as exc:
            tail = handle.console_tail()
            await self._undo_create(sid, exc)
            if isinstance(exc, SandboxCrashedError | ChannelClosed) and tail:
                raise BackendError(f"the microVM did not boot: {tail}") from None
            raise
        self._after_create(info)
        return handle

    async def restore_many(
        self, snap: snaps.MemorySnapshot, n: int, spec: SandboxSpec
    ) -> list[MicroVMSandbox]:
        """``n`` sandboxes restored from ``snap`` in parallel (each on its own overlay)."""
        results = await asyncio.gather(
            *(self._restore(snap, spec) for _ in range(n)), return_exceptions=True
        )
        made = [r for r in results if isinstance(r, MicroVMSandbox)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for h in made:
                await h.destroy()
            raise errors[0]
        return made

    async def _restore(
        self,
        snap: snaps.MemorySnapshot,
        spec: SandboxSpec,
        *,
        template: tuple[Path, BaselineInfo] | None = None,
    ) -> MicroVMSandbox:
        """One sandbox restored from ``snap``; with ``template`` (its dir and the baseline),
        a fresh sandbox of ``spec`` from a boot snapshot instead of a user's snapshot."""
        self.prepare()
        sdir = template[0] if template else snaps.snap_dir(self.home, snap.id)
        mem_file = snaps.check_size(self.home, snap, sdir)
        sid = new_id("sbx")
        if template is None:
            # a restored sandbox keeps the snapshot's device model, baseline and settings
            base_spec = SandboxSpec.model_validate(snap.spec) if snap.spec else spec
            spec = base_spec.model_copy(
                update={"from_snapshot": snap.id, "labels": spec.labels or base_spec.labels,
                        "ttl_s": spec.ttl_s}
            )  # fmt: skip
        info = self._new_info(spec, snap.baseline, sid)
        d = sandbox_dir(self.home, sid)
        d.mkdir(parents=True)
        rdir = qemu.run_dir(self.home.tag, sid)
        vm = qemu.VMConfig.from_json(dict(snap.vm))
        vm.name = qemu.proc_name(self.home.tag, sid)
        vm.disk = str(d / "disk-0.qcow2")
        vm.run_dir = str(rdir)
        vm.console_log = str(d / "console.log")
        vm.mem_file = str(sdir / "ram.img") if snap.layout == "split" else ""
        vm.tb_mb = self.vm_config.tb_mb  # host-side only: this backend's config, not the source's
        info.accelerator = vm.accel
        info.extra.update(
            run_dir=str(rdir),
            vm=vm.to_json(),
            disk_index=0,
            disk_mb=snap.disk_mb,
            kernel=snap.kernel,
        )
        if template is None:
            info.extra.update(snapshot=snap.id, snapshot_chain=[*snap.chain, snap.id])
            src = self._src_extra(snap.source)
            for key in ("image_env", "image_workdir", "image_user", "kernel_package"):
                if key in src:
                    info.extra[key] = src[key]
        else:
            cfg = template[1].config
            info.extra.update(
                boot_snapshot=sdir.name,
                kernel_package=self._kernel.package_version if self._kernel else "",
                image_env=list(cfg.env),
                image_workdir=cfg.workdir,
                image_user=cfg.user,
            )
        write_state(self.home, info)
        handle = MicroVMSandbox(self, info)
        try:
            if vm.nic:  # the snapshot's VM had a NIC: this branch gets its own network
                net = await asyncio.to_thread(setup_vm_network, self.home, sid, spec)
                info.extra["net"] = net
                vm.netns = net["netns"]
                info.extra["vm"] = vm.to_json()
                write_state(self.home, info)
            await asyncio.to_thread(
                disk.create_overlay, Path(vm.disk), Path(str(snap.vm["disk"])), "qcow2"
            )
            await asyncio.to_thread(self._load_memory, info, vm, mem_file, snap)
            write_state(self.home, info)
            async with handle._session(timeout=self.vm_config.boot_timeout_s) as ch:
                await ch.call(
                    "restored",
                    time_ns=time.time_ns(),
                    entropy=base64.b64encode(os.urandom(64)).decode(),
                )
                if template is not None:
                    await ch.call("configure", **_configure_args(spec, self.full_command_caps))
            info.state = "running"
            write_state(self.home, info)
        except BaseException as exc:
            await self._undo_create(sid, exc)
            raise
        self._after_create(info)
        return handle

    async def _undo_create(self, sid: str, exc: BaseException) -> None:
        """Destroy a sandbox whose create failed; what that left is noted on ``exc`` (the
        create's own error stays the one raised)."""
        try:
            await asyncio.to_thread(self.destroy_by_id, sid)
        except TeardownError as left:
            exc.add_note(f"and its teardown failed: {left}")

    def _load_memory(
        self, info: SandboxInfo, vm: qemu.VMConfig, mem_file: Path, snap: snaps.MemorySnapshot
    ) -> None:
        """Start QEMU paused with ``-incoming fd:``, stream the file in while hashing it,
        and let the VM run only if the hash matches."""
        r, w = os.pipe()
        # a 1 MiB pipe instead of 64 KiB: fewer wake-ups of QEMU and of the feeder per MB
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        try:
            pid = qemu.start(vm, incoming=f"fd:{r}", pass_fds=(r,))
        finally:
            os.close(r)
        info.extra["qemu_pid"] = pid
        write_state(self.home, info)
        _host_cgroup(self.home, info.id, info.spec, pid)
        digest: list[str] = []

        def feed() -> None:
            import hashlib

            h = hashlib.sha256()
            writing = True
            try:
                with open(mem_file, "rb") as f:
                    while block := f.read(1 << 20):
                        h.update(block)
                        view = memoryview(block)
                        while writing and view:
                            try:
                                n = os.write(w, view)
                            except OSError:  # QEMU gave up; keep hashing to tell why
                                writing = False
                                break
                            view = view[n:]
            except OSError:
                pass
            finally:
                os.close(w)
                digest.append(h.hexdigest())
            if snap.layout == "split":
                # checked while QEMU loads the state; the guest runs only if it matches
                try:
                    ram = Path(vm.mem_file)
                    if snap.ram_stat and snaps.fingerprint(ram) == snap.ram_stat:
                        digest.append(snap.ram_digest)  # unchanged since it was hashed
                    else:
                        digest.append(memfile.ram_digest(ram))
                except OSError:
                    digest.append("unreadable")

        t = threading.Thread(target=feed, daemon=True)
        t.start()
        deadline = time.monotonic() + self.vm_config.boot_timeout_s
        status = "unknown"
        mon: qemu.QMP | None = None
        try:
            mon = qemu.QMP(Path(vm.run_dir) / "qmp.sock")
            while True:
                status = mon.execute("query-status").get("status")
                if status != "inmigrate":
                    break
                if not qemu.alive(pid, vm.name) or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
        except (OSError, BackendError):
            status = "exited" if not qemu.alive(pid, vm.name) else "unreachable"
        try:
            t.join(timeout=60)
            # a corrupt stream may make QEMU quit mid-load; the hash says whether it was
            if not digest or digest[0] != snap.memory_sha256:
                raise CorruptionError(
                    f"memory snapshot {snap.id} does not match its recorded sha256; refused",
                    paths=[str(mem_file)],
                )
            if snap.layout == "split" and digest[1:] != [snap.ram_digest]:
                raise CorruptionError(
                    f"memory snapshot {snap.id}: its RAM image does not match the recorded "
                    "digest; refused",
                    paths=[vm.mem_file],
                )
            if mon is None or status not in ("paused", "prelaunch", "postmigrate"):
                raise BackendError(f"restore of {snap.id} failed (QEMU state {status})")
            mon.execute("cont")
        finally:
            if mon is not None:
                mon.close()

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        info = read_state(self.home, sandbox_id)
        if info.backend != self.name or info.state == "destroyed":
            raise SandboxNotFoundError(f"no live microvm sandbox {sandbox_id!r}")
        return MicroVMSandbox(self, info)

    def destroy_by_id(self, sandbox_id: str) -> list[str]:
        """Kill the QEMU and remove every host resource of one sandbox (idempotent).

        Returns:
            One line per removed resource.

        Raises:
            TeardownError: something could not be removed (every other step still ran).
        """
        removed: list[str] = []
        errors: list[str] = []
        d = sandbox_dir(self.home, sandbox_id)
        name = qemu.proc_name(self.home.tag, sandbox_id)
        snap_id = None
        info = None
        try:
            info = read_state(self.home, sandbox_id)
            pid = info.extra.get("qemu_pid")
            snap_id = info.extra.get("snapshot")
        except SandboxNotFoundError:
            pid = None
        procs = qemu.find_processes(name)
        for pid_ in {*procs.values(), *([pid] if isinstance(pid, int) else [])}:
            if qemu.alive(pid_, name):
                qemu.kill(pid_, name)
                removed.append(f"process {pid_} ({name})")
        try:
            if info is not None and teardown_vm_network(info):
                removed.append(f"network of {sandbox_id}")
        except (BackendError, OSError, KeyError, ValueError) as exc:  # incl. a bad record
            errors.append(f"network: {type(exc).__name__}: {exc}")
        try:
            if _drop_host_cgroup(self.home, sandbox_id):
                removed.append(f"cgroup rollbox-{self.home.tag}/{sandbox_id}")
        except (BackendError, OSError) as exc:
            errors.append(f"cgroup: {exc}")
        rdir = qemu.run_dir(self.home.tag, sandbox_id)
        for what, path in (("runtime dir", rdir), ("sandbox dir", d)):
            if path.exists():
                left = why_not_removed(path)
                if left is None:
                    removed.append(f"{what} {path}")
                else:
                    errors.append(f"{what}: {left}")
        with contextlib.suppress(OSError):
            rdir.parent.rmdir()
        if isinstance(snap_id, str):
            removed += self._drop_unused_snapshots()
        if errors:
            raise TeardownError(
                f"destroying {sandbox_id} left resources: {'; '.join(errors)}",
                errors=[f"sandbox {sandbox_id}: {e}" for e in errors],
                removed=removed,
            )
        return removed
