"""How a ``namespace`` sandbox is started: bwrap's hardening flags, the agent binary as a
sealed memfd, the per-exec ``box`` cgroup, and the agent's readiness (pipe or ping)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from pathlib import Path

from rollbox.backends.common.bundle import DEFAULT_CAPS
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.common.overlay_backend import ping_agent
from rollbox.errors import BackendError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUN_TMPFS_BYTES = 16 << 20
# Docker's default capability set without CAP_MKNOD (no device nodes in the rootfs, so the
# host never opens a device through a sandbox path); the same set the gVisor bundle gets.
CAPS = DEFAULT_CAPS

# Root inside is root on the host's kernel: without these, `echo 2 > /proc/sys/kernel/panic`
# or /proc/sysrq-trigger inside would change or crash the host (docker's readonly/masked paths).
# /proc/sys is bound from the host procfs read-only; its values follow the reader's namespaces.
PROC_HARDENING: list[str] = [
    *("--ro-bind", "/proc/sys", "/proc/sys"),
    *("--ro-bind-try", "/proc/fs", "/proc/fs"),  # bwrap itself covers irq and bus
    *(
        a
        for p in ("sysrq-trigger", "kcore", "keys", "timer_list", "sched_debug", "latency_stats")
        # bwrap cannot mask a file the kernel does not have (e.g. no CONFIG_MAGIC_SYSRQ)
        if os.path.exists(f"/proc/{p}")
        for a in ("--ro-bind", "/dev/null", f"/proc/{p}")
    ),
]


_MEMFDS: dict[Path, int] = {}
_MEMFD_LOCK = threading.Lock()


def agent_memfd(path: Path) -> int:
    """A sealed, read-only memfd holding the agent binary at ``path`` (one per process)."""
    with _MEMFD_LOCK:
        fd = _MEMFDS.get(path)
        if fd is None:
            fd = os.memfd_create("rollbox-agent", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            data = path.read_bytes()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals | fcntl.F_SEAL_WRITE)
            _MEMFDS[path] = fd
        return fd


BOX = "box"
"""Sub-group (pids + freezer) holding every exec's own group; the sandbox's group keeps
``PIDS_RESERVE`` pids more than the limit for the agent, so a fork bomb inside can never
stop the agent from answering or killing."""
PIDS_RESERVE = 16


def _make_box(cg: Cgroup, pids: int | None) -> None:
    if pids is not None:
        (cg.paths["pids"] / "pids.max").write_text(str(pids + PIDS_RESERVE))
    cg.child(BOX, ("pids", "freezer"), pids_max=pids)


def _wait_ready(fd: int, timeout: float = 10.0) -> bool:
    """True when the agent wrote its ready byte on ``fd`` within ``timeout``; False on EOF
    (everything holding the write end died) or timeout."""
    import select

    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, 1) == b"r"


_ping_sync = ping_agent  # the old name (gVisor's start waited with it)


class BwrapStart:
    """A launched bwrap sandbox: :meth:`wait` reaps the launcher (it exits right after
    forking) and waits for the agent's ready byte on the pipe."""

    def __init__(self, launcher: subprocess.Popen[bytes], ready_fd: int) -> None:
        self.launcher = launcher
        self.ready_fd = ready_fd

    def wait(self) -> bool:
        """True when the agent is ready; see :meth:`Starting.wait`.

        Raises:
            BackendError: the launcher failed.
        """
        if self.launcher.wait() != 0:
            raise BackendError(f"launching the sandbox failed (exit {self.launcher.returncode})")
        try:
            return _wait_ready(self.ready_fd)
        finally:
            self.close()

    def close(self) -> None:
        """Close the pipe's read end (idempotent)."""
        if self.ready_fd >= 0:
            os.close(self.ready_fd)
            self.ready_fd = -1
