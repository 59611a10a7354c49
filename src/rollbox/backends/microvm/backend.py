"""The ``microvm`` backend: every sandbox is its own QEMU ``microvm`` guest.

See the package docstring for the moving parts. A sandbox's host-side footprint:
``sandboxes/<id>/`` (state.json, console.log, its qcow2 disk(s)), the runtime dir
``/run/rbx/<tag>/<id>/`` (QMP and agent sockets, pid file) and one QEMU process named
``rbx-<tag>-<id>``. ``destroy()`` removes all three; ``cleanup_orphans()`` finds them when
their owner died, their TTL passed or QEMU is gone.

:class:`MicroVMBackend` is built in layers, one module each, every layer using only the ones
below it (and the :class:`~rollbox.backends.base.Backend` contract)::

    backend_base  prepare (kernel, initramfs, accelerator), check, records, snapshot store
    templates     boot snapshots: the key of a VM shape, dropping stale ones
    gc            cleanup_orphans
    lifecycle     create (cold boot or boot snapshot), restore, fork branches, destroy
    backend       registration and capabilities (this module)

and its handle :class:`MicroVMSandbox` likewise: ``sandbox_base`` (record, liveness, agent
session) -> ``sandbox_files`` -> ``sandbox_snapshots`` -> ``sandbox`` (exec, pause, destroy).
Constants are in ``defaults``, allow-list networking in ``net``.
"""

from __future__ import annotations

from typing import ClassVar

from rollbox.backends.microvm.defaults import assets_home
from rollbox.backends.microvm.lifecycle import VMLifecycle, _drop_host_cgroup, _host_cgroup
from rollbox.backends.microvm.sandbox import PRIVATE_FILES_MAX, MicroVMSandbox, _private_request
from rollbox.backends.microvm.sandbox_base import normalize
from rollbox.backends.registry import register_backend
from rollbox.models import Capabilities

# names outside code imported from this module before it was split
__all__ = [
    "PRIVATE_FILES_MAX",
    "MicroVMBackend",
    "MicroVMSandbox",
    "_drop_host_cgroup",
    "_host_cgroup",
    "_private_request",
    "assets_home",
    "normalize",
]


@register_backend
class MicroVMBackend(VMLifecycle):
    """QEMU microVMs: KVM where usable, TCG otherwise; memory snapshots, restore, fork."""

    name: ClassVar[str] = "microvm"
    capabilities: ClassVar[Capabilities] = Capabilities(
        snapshot=True,
        memory_snapshot=True,
        fork=True,
        pause=True,
        network_modes=["none", "loopback", "allow"],
        users=True,
    )
