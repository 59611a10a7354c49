"""The ``microvm`` backend: each sandbox is a QEMU ``microvm`` guest.

Parts: :mod:`.kernel` (Debian cloud kernel, unpacked under the home), :mod:`.initramfs`
(busybox + virtio modules + an init that starts the agent), :mod:`.disk` (per-digest ext4
images, per-sandbox qcow2), :mod:`.guest_agent` (PID 1 in the guest), :mod:`.channel`
(host side of the virtio-serial channel), :mod:`.qemu` (command line, QMP), :mod:`.probe`
(KVM or TCG), :mod:`.snapshot` (memory snapshot records), :mod:`.backend` (the contract;
its docstring maps the modules the backend and its sandbox handle are built from).
"""

from rollbox.backends.microvm.backend import MicroVMBackend, MicroVMSandbox

__all__ = ["MicroVMBackend", "MicroVMSandbox"]
