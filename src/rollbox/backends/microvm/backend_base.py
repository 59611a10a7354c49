"""The microVM backend's base: assets and accelerator, request checks, records, memory snapshots.

:class:`~.backend.MicroVMBackend` is one class built in layers, one module each: this base,
:mod:`.templates` (boot snapshots), :mod:`.gc` (orphan cleanup), :mod:`.lifecycle`
(create/restore/attach/destroy) and :mod:`.backend` (registration, capabilities). Each layer
uses only the ones below it and the :class:`~rollbox.backends.base.Backend` contract.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from datetime import timedelta
from pathlib import Path

from rollbox.backends.base import (
    Backend,
    MemorySnapshots,
)
from rollbox.backends.config import BackendConfig, MicroVMConfig
from rollbox.backends.microvm import probe, qemu
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.defaults import MIN_DISK_MB, MIN_MEMORY_MB, assets_home
from rollbox.backends.microvm.initramfs import ensure_initramfs
from rollbox.backends.microvm.kernel import GuestKernel, ensure_kernel
from rollbox.backends.microvm.sandbox_base import extra_list
from rollbox.backends.state import (
    list_states,
    owner_fields,
    read_state,
)
from rollbox.config import Home
from rollbox.errors import (
    BackendUnavailableError,
    InvalidInputError,
    LimitsError,
    SandboxNotFoundError,
)
from rollbox.models import (
    SandboxInfo,
    SandboxSpec,
    utcnow,
)


class VMBackendBase(Backend, MemorySnapshots):
    """The microVM backend's setup, checks, records and memory-snapshot store."""

    def __init__(
        self, home: Home, *, detached: bool = False, config: BackendConfig | None = None
    ) -> None:
        super().__init__(home, detached=detached, config=config)
        self.full_command_caps = False
        """Commands keep every capability in the guest (CAP_SYS_ADMIN included), for a
        trusted workload that needs them (rollbox nested in the guest). Off by default:
        commands get Docker's default set, and only the verifier's private execs keep the
        marker capability that shields them from what the agent left running."""
        self._kernel: GuestKernel | None = None
        self._initrd: Path | None = None
        self._accel: probe.ProbeResult | None = None

    def version(self) -> str:
        return qemu.version()

    def prepare(self) -> None:
        qemu.version()
        for tool, pkg in (("qemu-img", "qemu-utils"), ("mkfs.ext4", "e2fsprogs")):
            if shutil.which(tool) is None:
                raise BackendUnavailableError(
                    f"{tool} is not installed", hint=f"apt-get install {pkg}"
                )
        if self._kernel is not None:
            return
        assets = assets_home(self.home)
        kernel = ensure_kernel(assets)
        self._initrd = ensure_initramfs(assets, kernel)
        probe_initrd = ensure_initramfs(assets, kernel, probe=True)
        cfg = self.vm_config
        self._accel = probe.choose(
            assets.vm,
            kernel.vmlinuz,
            probe_initrd,
            accel=cfg.accel,
            device=cfg.kvm_device,
            timeout=cfg.probe_timeout_s,
        )
        self._kernel = kernel

    @property
    def accelerator(self) -> probe.ProbeResult:
        """The accelerator new sandboxes use (probed at :meth:`prepare`)."""
        self.prepare()
        assert self._accel is not None
        return self._accel

    def hardware_virtualized(self) -> tuple[bool, str]:
        """KVM where the probe guest boots under it (see :mod:`.probe`), else TCG."""
        result = self.accelerator
        return result.accelerator == "kvm", result.reason

    def check(self, spec: SandboxSpec) -> None:
        super().check(spec)
        lim = spec.limits
        ncpu = os.cpu_count() or 1
        if lim.cpus is not None and math.ceil(lim.cpus) > max(ncpu * 4, 4):
            raise LimitsError(f"{lim.cpus} vCPUs is too many for this host ({ncpu} CPUs)")
        if lim.memory_mb is not None and lim.memory_mb < MIN_MEMORY_MB:
            raise LimitsError(f"memory limit {lim.memory_mb} MiB is below {MIN_MEMORY_MB} MiB")
        if lim.disk_mb is not None and lim.disk_mb < MIN_DISK_MB:
            raise LimitsError(f"disk limit {lim.disk_mb} MiB is below {MIN_DISK_MB} MiB")
        from rollbox.backends.common.hostlimits import check_disk

        check_disk(lim, "file", self.home.root)  # the qcow2 overlay grows under the home
        if spec.from_snapshot:
            snaps.load(self.home, spec.from_snapshot)

    def _new_info(self, spec: SandboxSpec, baseline: str, sid: str) -> SandboxInfo:
        owner_pid, extra = owner_fields(self.detach)
        now = utcnow()
        return SandboxInfo(
            id=sid,
            backend=self.name,
            backend_version=self.version(),
            baseline=baseline,
            spec=spec,
            state="creating",
            created_at=now,
            expires_at=now + timedelta(seconds=spec.ttl_s) if spec.ttl_s else None,
            owner_pid=owner_pid,
            extra=extra,
        )

    def _after_create(self, info: SandboxInfo) -> None:
        if info.expires_at is not None:
            from rollbox.backends.reaper import ensure_reaper

            ensure_reaper(self.home)

    def _src_extra(self, source: str) -> dict[str, object]:
        with contextlib.suppress(SandboxNotFoundError):
            return read_state(self.home, source).extra
        return {}

    def list_sandboxes(self) -> list[SandboxInfo]:
        return list_states(self.home, self.name)

    @property
    def vm_config(self) -> MicroVMConfig:
        """:attr:`config` as the microVM's own model."""
        cfg = self.config
        if not isinstance(cfg, MicroVMConfig):
            raise InvalidInputError(f"a {cfg.type!r} config was given to backend 'microvm'")
        return cfg

    def list_snapshots(self) -> list[snaps.MemorySnapshot]:
        """The memory snapshots of this home."""
        return snaps.all_snapshots(self.home)

    def load_snapshot(self, snap_id: str) -> snaps.MemorySnapshot:
        """The record of ``snap_id`` (see :func:`snapshot.load`)."""
        return snaps.load(self.home, snap_id)

    def remove_snapshot(self, snap_id: str) -> None:
        """Delete a memory snapshot.

        Raises:
            SnapshotNotFoundError: no such snapshot.
            InUseError: a live sandbox or another snapshot is stacked on its disk.
        """
        from rollbox.errors import InUseError

        snaps.load(self.home, snap_id)
        users = [
            i.id
            for i in list_states(self.home, self.name)
            if snap_id in extra_list(i, "snapshot_chain")
        ]
        users += [r.id for r in snaps.all_snapshots(self.home) if snap_id in r.chain]
        if users:
            raise InUseError(
                f"memory snapshot {snap_id} is in use by {', '.join(users)}",
                hint="destroy those first",
            )
        snaps.remove(self.home, snap_id)
