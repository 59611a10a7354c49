"""The ``namespace`` backend: bubblewrap + cgroup v1 + seccomp + the rollbox agent.

A sandbox is::

    rollbox-agent launch  (host, exits at once)
      └─ rollbox-agent launch  (subreaper outside the cgroups, only reaps bwrap)
           └─ bwrap            (host pid ns; joined the sandbox's cgroups before exec)
           └─ rollbox-agent serve   (PID 1 of new pid/mount/net/ipc/uts/cgroup namespaces,
                                     seccomp filter, docker-like capability set)
                └─ one session process per exec ─ the command (joins its own per-exec
                                   freezer/pids cgroup through fds the host passed)

The root is an overlay of the baseline's layers with an upper dir on a tmpfs of
``disk_mb`` (:mod:`rollbox.backends.common.rootfs`). The agent's listening socket is made
by the host and inherited, so nothing inside can replace it and the host may connect before
the agent runs. Why bwrap and not runc: see docs/design.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import ClassVar

from rollbox.backends.agent.build import agent_binary
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.common.overlay_backend import OverlayBackend
from rollbox.backends.common.overlay_sandbox import OverlaySandbox
from rollbox.backends.config import BackendConfig
from rollbox.backends.namespace.launch import (
    BOX,
    CAPS,
    DEFAULT_PATH,
    PIDS_RESERVE,
    PROC_HARDENING,
    RUN_TMPFS_BYTES,
    BwrapStart,
    _make_box,
    _ping_sync,
    _wait_ready,
    agent_memfd,
)
from rollbox.backends.namespace.sandbox import NamespaceSandbox, _shielded_kill
from rollbox.backends.namespace.seccomp import filter_file
from rollbox.backends.registry import register_backend
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.models import Capabilities, SandboxSpec

_PREPARED: dict[Path, tuple[Path, Path]] = {}
"""Per home: (agent binary, seccomp filter file), built once per process."""


def _tool_version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


@register_backend
class NamespaceBackend(OverlayBackend):
    """Linux namespaces via bubblewrap, cgroup v1 limits, seccomp, dropped capabilities."""

    name: ClassVar[str] = "namespace"
    capabilities: ClassVar[Capabilities] = Capabilities(
        snapshot=True,
        memory_snapshot=False,
        fork=True,
        pause=True,
        network_modes=["none", "loopback", "allow"],
        users=True,
    )
    sandbox_class: ClassVar[type[OverlaySandbox]] = NamespaceSandbox

    def __init__(
        self, home: Home, *, detached: bool = False, config: BackendConfig | None = None
    ) -> None:
        super().__init__(home, detached=detached, config=config)
        self._seccomp: Path | None = None
        self._prepare_lock = threading.Lock()
        self._bwrap: str | None = None

    # ------------------------------------------------------------------ backend-wide

    def version(self) -> str:
        """``bubblewrap <version>``."""
        return _tool_version(["bwrap", "--version"]) or "bubblewrap"

    def prepare(self) -> None:
        """Check bwrap, root, cgroup v1 and build the agent and seccomp filter (cached)."""
        if self._agent is not None:
            return
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise BackendUnavailableError(
                "bubblewrap (bwrap) is not installed", hint="apt-get install bubblewrap"
            )
        if os.geteuid() != 0:
            raise BackendUnavailableError(
                "the namespace backend needs root (cgroups, overlay mounts)",
                hint="run as root",
            )
        from rollbox.backends.common.cgroups import require_cgroups

        require_cgroups()
        with self._prepare_lock:  # concurrent creates call this from worker threads
            if self._agent is not None:
                return
            # Per process and home: the facade makes a backend instance per sandbox.
            cached = _PREPARED.get(self.home.root)
            if cached is None or not all(p.exists() for p in cached):
                self.home.ensure()
                cached = (agent_binary(self.home), filter_file(self.home.root / "bin"))
                _PREPARED[self.home.root] = cached
            self._seccomp = cached[1]
            self._bwrap = bwrap
            self._agent = cached[0]  # last: it is the "prepared" flag read without the lock

    # ------------------------------------------------------------------ start

    def _prepare_cgroup(self, cg: Cgroup, spec: SandboxSpec) -> None:
        """The ``box`` sub-group every exec's own group goes in (see :data:`BOX`)."""
        _make_box(cg, spec.limits.pids)

    def _retryable(self, log: str) -> bool:
        """bwrap's own setup failed (seen transiently while other tools remount /proc on
        the host): worth one more start."""
        return log.startswith("bwrap:")

    def _start(self, sdir: Path, spec: SandboxSpec, cg: Cgroup, netns: str, lfd: int) -> BwrapStart:
        """Spawn ``rollbox-agent launch … bwrap …`` with a pipe the agent writes its ready
        byte to; see :meth:`OverlayBackend._start`."""
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        try:
            launcher = self._spawn(sdir, spec, cg, netns, lfd, ready_w)
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        return BwrapStart(launcher, ready_r)

    def _spawn(
        self,
        sdir: Path,
        spec: SandboxSpec,
        cg: Cgroup,
        netns: str,
        lfd: int,
        ready_fd: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Spawn ``rollbox-agent launch … bwrap …``; the caller reaps the launcher."""
        assert self._agent is not None and self._seccomp is not None and self._bwrap is not None
        procs = ",".join(str(p) for p in cg.procs_files())
        seccomp_fd = os.open(self._seccomp, os.O_RDONLY)
        argv = [str(self._agent), "launch", procs, netns, "--", self._bwrap]
        argv += ["--bind", str(sdir / "rootfs"), "/", "--dev", "/dev", "--proc", "/proc"]
        argv += PROC_HARDENING
        argv += ["--perms", "0755", "--size", str(RUN_TMPFS_BYTES), "--tmpfs", "/run"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if netns == "-":
            argv.append("--unshare-net")
        argv += ["--hostname", spec.hostname, "--as-pid-1", "--new-session", "--chdir", "/"]
        argv += ["--cap-drop", "ALL"]
        # CAP_SYS_ADMIN and no filter for the agent alone: it builds the verifier's private
        # mount namespace; every command drops that capability and loads the seccomp
        # filter itself before exec (agent.c restrict_command). CAP_WAKE_ALARM is kept by
        # verifier commands only: the processes the agent left cannot reach theirs.
        for cap in [*CAPS, "CAP_SYS_ADMIN", "CAP_WAKE_ALARM"]:
            argv += ["--cap-add", cap]
        # The agent runs from a sealed memfd, not a bind mount: a bind would show its host
        # path (under ROLLBOX_HOME) in the sandbox's /proc/self/mountinfo.
        agent_fd = agent_memfd(self._agent)
        argv += [f"/proc/self/fd/{agent_fd}", "serve", str(lfd)]
        fds = [lfd, seccomp_fd, agent_fd]
        argv.append(str(ready_fd) if ready_fd is not None else "-")
        argv.append(str(seccomp_fd))
        if ready_fd is not None:
            fds.append(ready_fd)
        try:
            with open(sdir / "sandbox.log", "wb") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=fds,
                    env={"PATH": DEFAULT_PATH},
                )
        finally:
            os.close(seccomp_fd)
        return proc


__all__ = [
    "BOX",
    "CAPS",
    "DEFAULT_PATH",
    "PIDS_RESERVE",
    "PROC_HARDENING",
    "RUN_TMPFS_BYTES",
    "NamespaceBackend",
    "NamespaceSandbox",
    "_make_box",
    "_ping_sync",
    "_shielded_kill",
    "_wait_ready",
    "agent_memfd",
]
