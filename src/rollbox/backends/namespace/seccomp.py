"""A seccomp BPF program for sandboxes, generated with libseccomp through ctypes.

Default allow, with a deny list modelled on Docker's default profile: syscalls that
change mounts, namespaces, keyrings, kernel modules, the clock, tracing of other
processes, BPF, and ``ioctl(TIOCSTI)`` (typing into another terminal) fail with EPERM;
``clone`` with namespace flags fails with EPERM and ``clone3`` with ENOSYS (so libc falls
back to ``clone``, whose flags can be inspected). Other architectures (i386/x32 entry
points) are killed by libseccomp's default bad-arch action.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
from pathlib import Path

from rollbox.errors import BackendUnavailableError

DENY = [
    "mount",
    "umount2",
    "pivot_root",
    "chroot_noop",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "unshare",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "fanotify_init",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "stime",
    "syslog",
    "vhangup",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "personality",
    "vm86",
    "vm86old",
    "pciconfig_read",
    "pciconfig_write",
    "lsm_set_self_attr",
]

CLONE_NS_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
SCMP_CMP_MASKED_EQ = 7


def _errno_action(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise BackendUnavailableError(
            "libseccomp is missing", hint="apt-get install libseccomp2"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, cmps: list[_ArgCmp]) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:
        return  # not a syscall on this architecture
    arr = (_ArgCmp * len(cmps))(*cmps) if cmps else None
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
    if rc != 0:
        raise BackendUnavailableError(f"libseccomp refused a rule for {name}: {os.strerror(-rc)}")


def build_filter() -> bytes:
    """The BPF program (raw ``struct sock_filter`` array, as ``bwrap --seccomp`` reads it)."""
    lib = _lib()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise BackendUnavailableError("seccomp_init failed")
    try:
        eperm = _errno_action(errno.EPERM)
        for name in DENY:
            _rule(lib, ctx, eperm, name, [])
        for flag in CLONE_NS_FLAGS:
            _rule(lib, ctx, eperm, "clone", [_ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag)])
        _rule(lib, ctx, _errno_action(errno.ENOSYS), "clone3", [])
        for req in (TIOCSTI, TIOCLINUX):
            _rule(lib, ctx, eperm, "ioctl", [_ArgCmp(1, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, req)])
        r, w = os.pipe()
        try:
            rc = lib.seccomp_export_bpf(ctx, w)
            os.close(w)
            w = -1
            if rc != 0:
                raise BackendUnavailableError(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            chunks = []
            while chunk := os.read(r, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
    finally:
        lib.seccomp_release(ctx)


def filter_file(cache_dir: Path) -> Path:
    """The BPF program cached in ``cache_dir`` (named by its content hash)."""
    data = build_filter()
    path = cache_dir / f"seccomp-{hashlib.sha256(data).hexdigest()[:12]}.bpf"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path
