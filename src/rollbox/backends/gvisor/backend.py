"""The ``gvisor`` backend: the namespace backend's sandbox, run by ``runsc`` instead of bwrap.

Everything around the runtime is shared with the ``namespace`` backend through
:class:`~rollbox.backends.common.overlay_backend.OverlayBackend` and
:class:`~rollbox.backends.common.overlay_sandbox.OverlaySandbox` (the sandbox directory and
``state.json``, overlay rootfs with a tmpfs upper, the cgroup, the allow-list network, the
agent and its wire protocol, safe host-side file access, snapshot and fork through the
upper dir, freezer pause, the exec preparation); this module says how a sandbox is
started, how an exec's process tree is killed and how a sandbox is torn down.

A sandbox is::

    runsc run --detach (OCI bundle = the sandbox dir, config.json written here)
      runsc-gofer + runsc-sandbox (sentry) + ptrace stubs   (host, in the sandbox's cgroup)
        └─ rollbox-uds-listen /run/rollbox/agent.sock -- agent serve 3   (PID 1 in gVisor)
             └─ one session process per exec ─ the command

Channel: a host listening socket cannot be handed into gVisor, so a tiny static helper
(``uds_listen.c``) binds ``/run/rollbox/agent.sock`` inside, on the host directory
``<sandbox>/run`` bind-mounted there; ``--host-uds=create`` makes that a real host socket.

Flags: ``--overlay2=none`` so writes land in the host overlay upper (snapshot, fork, disk
limit and host-side file access all read it), ``--file-access=shared`` so files the host
writes into the rootfs are seen inside at once, ``--network=none`` (modes none/loopback)
or, for allow lists, ``--network=sandbox`` (gVisor's netstack) in the sandbox's netns (see
:meth:`GVisorBackend._launch` for the workaround this runsc needs on this kernel).

Limits inside gVisor: the host cgroup holds the sentry, the gofer and the ptrace stubs,
so its memory and pids limits get an allowance for them on top of the sandbox's limits
(:data:`MEMORY_OVERHEAD_MB`, :data:`PIDS_OVERHEAD`, :data:`PIDS_PER_PROCESS`); ``pids`` is
enforced inside as RLIMIT_NPROC of every exec (gVisor applies it to root without
CAP_SYS_RESOURCE, which the bundle does not grant). Per-exec process trees are
found with ``runsc ps`` (there are no per-exec host cgroups: the processes are the
sentry's) and killed with ``runsc kill --pid``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from rollbox.backends.agent.build import agent_binary
from rollbox.backends.common.bundle import DEFAULT_PATH, oci_config, write_bundle
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.common.overlay_backend import OverlayBackend, Started, ping_agent
from rollbox.backends.common.overlay_sandbox import OverlaySandbox
from rollbox.backends.config import BackendConfig
from rollbox.backends.gvisor.helper import helper_binary, statx_shim
from rollbox.backends.gvisor.layout import (
    AGENT_DIR,
    HELPER,
    MEMORY_OVERHEAD_MB,
    PIDS_HOST_CAP,
    PIDS_OVERHEAD,
    PIDS_PER_PROCESS,
    SOCKET_IN_SANDBOX,
    START_TIMEOUT_S,
    STATX_SHIM,
    runsc_root,
    runsc_state,
)
from rollbox.backends.gvisor.sandbox import GVisorSandbox, exec_victims
from rollbox.backends.registry import register_backend
from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    BackendUnavailableError,
    RollboxError,
    TeardownError,
    UnsupportedOperationError,
)
from rollbox.models import Capabilities, SandboxSpec


@register_backend
class GVisorBackend(OverlayBackend):
    """gVisor's user-space kernel (``runsc``, ptrace platform) around the same sandbox."""

    name: ClassVar[str] = "gvisor"
    sandbox_class: ClassVar[type[OverlaySandbox]] = GVisorSandbox
    capabilities: ClassVar[Capabilities] = Capabilities(
        snapshot=True,
        memory_snapshot=False,  # runsc checkpoint/restore hangs on this build (20221219)
        fork=True,
        pause=True,
        network_modes=["none", "loopback", "allow"],
        users=True,
    )

    def __init__(
        self, home: Home, *, detached: bool = False, config: BackendConfig | None = None
    ) -> None:
        super().__init__(home, detached=detached, config=config)
        self._runsc: str | None = None
        self._helper: Path | None = None
        self._statx: Path | None = None

    # Per process: a sandbox create makes a new backend instance, and `runsc --version`
    # alone costs ~40 ms.
    _runsc_version: ClassVar[str | None] = None
    _prepared: ClassVar[dict[Path, tuple[str, Path, Path, Path]]] = {}

    def version(self) -> str:
        """``runsc version <...>``."""
        if GVisorBackend._runsc_version is None:
            try:
                out = subprocess.run(
                    ["runsc", "--version"], capture_output=True, text=True, timeout=5, check=False
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                return "runsc"
            GVisorBackend._runsc_version = out.splitlines()[0].strip() if out.strip() else "runsc"
        return GVisorBackend._runsc_version

    def version_cached(self) -> str:
        """The tool version (computed once per process)."""
        return self.version()

    def prepare(self) -> None:
        """Check runsc and root, build the agent and the socket helper (cached)."""
        if self._agent is not None:
            return
        cached = GVisorBackend._prepared.get(self.home.root)
        if cached is not None and all(Path(p).exists() for p in cached):
            self._runsc, self._helper, self._agent, self._statx = cached
            return
        runsc = shutil.which("runsc")
        if runsc is None:
            raise BackendUnavailableError(
                "gVisor (runsc) is not installed", hint="apt-get install runsc"
            )
        if os.geteuid() != 0:
            raise BackendUnavailableError(
                "the gvisor backend needs root (cgroups, overlay mounts)", hint="run as root"
            )
        from rollbox.backends.common.cgroups import require_cgroups

        require_cgroups()
        self.home.ensure()
        runsc_root(self.home).mkdir(mode=0o700, exist_ok=True)
        self._helper = helper_binary(self.home)
        self._runsc = runsc
        self._agent = agent_binary(self.home)
        self._statx = statx_shim(self.home)
        GVisorBackend._prepared[self.home.root] = (runsc, self._helper, self._agent, self._statx)

    def check(self, spec: SandboxSpec) -> None:
        """Preflight as the namespace backend; memory snapshots are refused."""
        if spec.from_snapshot:
            raise UnsupportedOperationError(
                "gvisor",
                "memory_snapshot",
                hint="no memory snapshots: runsc checkpoint/restore hangs on this runsc build; "
                "use backend microvm",
            )
        super().check(spec)

    def _runsc_argv(self, *args: str) -> list[str]:
        assert self._runsc is not None
        return [self._runsc, "--root", str(runsc_root(self.home)), *args]

    def _start(self, sdir: Path, spec: SandboxSpec, cg: Cgroup, netns: str, lfd: int) -> Started:
        """Write the OCI bundle and ``runsc run --detach`` it; wait for the agent.

        ``lfd`` (the base class's host-made listening socket) cannot be passed into gVisor;
        the helper makes the socket inside instead, at the same host path.
        """
        assert self._agent is not None and self._helper is not None and self._statx is not None
        sid = sdir.name
        # Allowance for gVisor's own host processes (see the module docstring).
        host_limits = spec.limits.model_copy(
            update={
                "memory_mb": None
                if spec.limits.memory_mb is None
                else spec.limits.memory_mb + MEMORY_OVERHEAD_MB,
                "pids": None
                if spec.limits.pids is None
                else min(spec.limits.pids * PIDS_PER_PROCESS, PIDS_HOST_CAP) + PIDS_OVERHEAD,
            }
        )
        cg.apply(host_limits.model_copy(update={"cpus": None}))
        # runsc's boot (Go runtime, gofer, sentry) runs unthrottled; the quota applies
        # from the moment the sandbox can run anything of the user's.
        cg.clear_cpu_limit()
        tmp = sdir / "rootfs" / "tmp"
        if not tmp.is_dir() and not tmp.is_symlink():
            tmp.mkdir(mode=0o1777)
            os.chmod(tmp, 0o1777)
        config = oci_config(
            rootfs=sdir / "rootfs",
            args=[
                HELPER,
                SOCKET_IN_SANDBOX,
                "--",
                f"{AGENT_DIR}/agent",
                "serve",
                "3",
            ],
            hostname=spec.hostname,
            limits=spec.limits,
            cgroups_path=cg.oci_path,
            ro_binds={
                f"{AGENT_DIR}/agent": self._agent,
                HELPER: self._helper,
                STATX_SHIM: self._statx,
            },
            # runsc mounts its own tmpfs on an empty /tmp unless the spec mounts something
            # there; bind the overlay's /tmp so /tmp writes count against the disk limit
            # and show in snapshots, forks and the files API like everywhere else.
            rw_binds={"/run/rollbox": sdir / "run", "/tmp": tmp},
            netns_path=None if netns == "-" else Path(netns),
        )
        write_bundle(sdir, config)
        sock = sdir / "run" / "agent.sock"
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()  # the base class's socket: the helper binds its own here
        # allow mode: gVisor's own netstack on the sandbox netns's veth (--network=sandbox).
        # runsc 20221219 refuses to start it on this kernel: its "root netns?" test is
        # whether /proc/sys/net/core/rmem_default exists, and recent kernels have it in
        # every netns. So runsc runs in a private mount namespace where /proc/sys/net is
        # hidden under an empty tmpfs (it reads nothing else there).
        prefix: list[str] = []
        if netns != "-":
            prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
            prefix += ['mount -t tmpfs -o size=4k rollbox-hide /proc/sys/net && exec "$@"', "sh"]
        network = "none" if netns == "-" else "sandbox"
        argv = prefix + self._runsc_argv(
            f"--network={network}",
            "--host-uds=create",
            "--overlay2=none",
            "--file-access=shared",
            f"--panic-log={sdir / 'runsc-panic.log'}",
            "run",
            "--detach",
            "--bundle",
            str(sdir),
            sid,
        )
        with open(sdir / "sandbox.log", "wb") as log:
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={"PATH": DEFAULT_PATH},
                check=False,
            )
        if proc.returncode != 0:
            text = (sdir / "sandbox.log").read_text(errors="replace").strip()[-500:]
            raise BackendError(f"runsc run failed (exit {proc.returncode}): {text}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (sock.exists() and ping_agent(sock, timeout=2.0)):
            if time.monotonic() > deadline:
                text = (sdir / "sandbox.log").read_text(errors="replace").strip()[-500:]
                raise BackendError(f"the gVisor sandbox {sid} did not start: {text or 'no output'}")
            time.sleep(0.002)
        cg.apply(host_limits)
        return Started(sock)

    def _teardown_names(self, sandbox_id: str, net: dict[str, object] | None) -> None:
        errors: list[str] = []
        try:
            self._runsc_delete(sandbox_id)
        except (OSError, RollboxError, subprocess.TimeoutExpired) as exc:
            errors.append(f"runsc: {exc}")
        try:
            super()._teardown_names(sandbox_id, net)
        except BackendError as exc:
            errors.append(str(exc))
        try:
            # runsc also made the group in cpuset, devices and the named systemd
            # hierarchy; the namespace teardown only knows its own controllers.
            Cgroup.open(self.home.tag, sandbox_id).destroy()
        except (OSError, RollboxError) as exc:
            errors.append(f"cgroup: {exc}")
        if errors:
            raise TeardownError(
                f"destroying {sandbox_id} left resources: {'; '.join(errors)}",
                errors=[f"sandbox {sandbox_id}: {e}" for e in errors],
            )

    def _runsc_delete(self, sandbox_id: str) -> None:
        """Stop the sandbox and drop runsc's state for it.

        The fast path kills every host process of the sandbox (sentry, gofer, stubs) through
        its cgroup and removes runsc's two state files: ``runsc delete --force`` takes
        ~1.2 s here, most of it polling for the already-killed sentry to go away. When the
        cgroup cannot be emptied, ``runsc delete --force`` is the fallback.
        """
        state_dir = runsc_root(self.home)
        files = [p for p in _listdir(state_dir) if p.name.startswith(f"{sandbox_id}_")]
        if not files:
            return  # runsc has no state for it: nothing to delete
        cg = Cgroup.open(self.home.tag, sandbox_id)
        if cg.exists():
            with contextlib.suppress(OSError, RollboxError):
                cg.kill_all()
            if not cg.pids():
                for p in files:
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                return
        runsc = self._runsc or shutil.which("runsc")
        if runsc is None:
            return
        proc = subprocess.run(
            [runsc, "--root", str(state_dir), "delete", "--force", sandbox_id],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0 and "does not exist" not in proc.stderr:
            raise BackendError(f"runsc delete {sandbox_id}: {proc.stderr.strip()[-300:]}")

    def list_runsc_containers(self) -> list[str]:
        """Container ids in this home's runsc state directory."""
        if not runsc_root(self.home).is_dir() or shutil.which("runsc") is None:
            return []
        proc = subprocess.run(
            ["runsc", "--root", str(runsc_root(self.home)), "list", "--quiet"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()]

    def cleanup_orphans(self, *, dry_run: bool = False) -> list[str]:
        """As the namespace backend, plus runsc containers of this home with no live
        sandbox."""
        lines = []
        errors: list[str] = []
        live_before = {i.id for i in self.list_sandboxes() if self._dead_reason(i) is None}
        for cid in self.list_runsc_containers():
            if cid in live_before:
                continue
            if not dry_run:
                try:
                    self._runsc_delete(cid)
                except (OSError, RollboxError, subprocess.TimeoutExpired) as exc:
                    errors.append(f"runsc container {cid}: {exc}")
                    continue
            lines.append(f"runsc container {cid}")
        try:
            rest = super().cleanup_orphans(dry_run=dry_run)
        except TeardownError as exc:
            rest, errors = exc.removed, exc.errors + errors
        if errors:
            raise TeardownError(
                f"cleanup of {self.name} sandboxes left {len(errors)} resource(s)",
                errors=errors,
                removed=rest + lines,
            )
        return rest + lines


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        return []


__all__ = [
    "AGENT_DIR",
    "HELPER",
    "MEMORY_OVERHEAD_MB",
    "PIDS_HOST_CAP",
    "PIDS_OVERHEAD",
    "PIDS_PER_PROCESS",
    "SOCKET_IN_SANDBOX",
    "START_TIMEOUT_S",
    "STATX_SHIM",
    "GVisorBackend",
    "GVisorSandbox",
    "exec_victims",
    "runsc_root",
    "runsc_state",
]
