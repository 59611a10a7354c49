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
the agent runs. Why bwrap and not runc: see the README, "Design notes".
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from rollbox.backends.agent.build import agent_binary
from rollbox.backends.agent.client import short_unix_path
from rollbox.backends.base import Backend
from rollbox.backends.common import teardown
from rollbox.backends.common.cgroups import Cgroup, remove_orphan_cgroups
from rollbox.backends.common.rootfs import Rootfs, remove_orphan_mounts, remove_sandbox_dir
from rollbox.backends.config import BackendConfig
from rollbox.backends.namespace.launch import (
    BOX,
    CAPS,
    DEFAULT_PATH,
    PIDS_RESERVE,
    PROC_HARDENING,
    RUN_TMPFS_BYTES,
    _make_box,
    _ping_sync,
    _wait_ready,
    agent_memfd,
)
from rollbox.backends.namespace.sandbox import NamespaceSandbox, _shielded_kill
from rollbox.backends.namespace.seccomp import filter_file
from rollbox.backends.registry import register_backend
from rollbox.backends.state import (
    expired,
    list_states,
    owner_fields,
    owner_gone,
    read_state,
    sandbox_dir,
    write_state,
)
from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidInputError,
    RollboxError,
    SandboxNotFoundError,
    TeardownError,
)
from rollbox.ids import new_id
from rollbox.models import BaselineInfo, Capabilities, SandboxInfo, SandboxSpec, utcnow

_PREPARED: dict[Path, tuple[Path, Path]] = {}
"""Per home: (agent binary, seccomp filter file), built once per process."""
_VERSIONS: dict[str, str] = {}
"""Per backend class: its tool's version string, asked once per process."""


def _network_module() -> Any:
    """B2's allow-list networking, or ``None`` when it is not available."""
    try:
        from rollbox.backends.common import network
    except ImportError:
        return None
    return network


def _tool_version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


@register_backend
class NamespaceBackend(Backend):
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

    def __init__(
        self, home: Home, *, detached: bool = False, config: BackendConfig | None = None
    ) -> None:
        super().__init__(home, detached=detached, config=config)
        self._agent: Path | None = None
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

    def check(self, spec: SandboxSpec) -> None:
        """Preflight: network mode, limits and the allow-list before anything starts."""
        super().check(spec)
        from rollbox.backends.common.cgroups import check_limits

        check_limits(spec.limits)
        from rollbox.backends.common.hostlimits import check_disk

        check_disk(spec.limits, "tmpfs")  # the writable layer is a tmpfs
        if spec.network.mode == "allow" and _network_module() is None:
            raise BackendUnavailableError("allow-list networking is not available here")
        if not spec.hostname or len(spec.hostname) > 63 or "/" in spec.hostname:
            raise InvalidInputError(f"bad hostname {spec.hostname!r}")

    # ------------------------------------------------------------------ sandboxes

    async def create(self, spec: SandboxSpec, baseline: BaselineInfo) -> NamespaceSandbox:
        """Create and start a sandbox; see :meth:`Backend.create`."""
        return await asyncio.to_thread(self._create_sync, spec, baseline, None)

    def _create_sync(
        self, spec: SandboxSpec, baseline: BaselineInfo, upper_from: Path | None
    ) -> NamespaceSandbox:
        from rollbox.baselines.store import BaselineStore

        self.check(spec)
        self.prepare()
        assert self._agent is not None and self._seccomp is not None and self._bwrap is not None
        sid = new_id("sbx")
        sdir = sandbox_dir(self.home, sid)
        now = utcnow()
        owner_pid, extra = owner_fields(self.detach)
        info = SandboxInfo(
            id=sid,
            backend=self.name,
            backend_version=self.version_cached(),
            baseline=baseline.digest,
            spec=spec.model_copy(update={"baseline": baseline.digest}),
            state="creating",
            created_at=now,
            expires_at=now + timedelta(seconds=spec.ttl_s) if spec.ttl_s else None,
            owner_pid=owner_pid,
            extra={
                **extra,
                "image_env": list(baseline.config.env),
                "image_workdir": baseline.config.workdir or "/",
                "image_user": baseline.config.user,
            },
        )
        self.home.sandboxes.mkdir(parents=True, exist_ok=True)
        sdir.mkdir()
        (sdir / "run").mkdir(mode=0o700)
        write_state(self.home, info)
        lsock: socket.socket | None = None
        ready_r = -1
        try:
            layers = BaselineStore(self.home).layer_dirs(baseline.digest)
            Rootfs.mount(sdir, layers, spec.limits.disk_mb, upper_from=upper_from)
            cg = Cgroup.create(self.home.tag, sid, spec.limits)
            _make_box(cg, spec.limits.pids)
            netns = "-"
            if spec.network.mode == "allow":
                net = _network_module().setup_network(self.home.tag, sid, spec.network)
                info.extra["net"] = net.to_dict()
                netns = str(net.netns_path)
            sock_path = sdir / "run" / "agent.sock"
            for attempt in (1, 2):
                sock_path.unlink(missing_ok=True)
                lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                with short_unix_path(sock_path) as bind_path:
                    lsock.bind(bind_path)
                lsock.listen(64)
                if type(self)._launch is NamespaceBackend._launch:
                    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
                    try:
                        launcher = self._spawn(sdir, spec, cg, netns, lsock.fileno(), ready_w)
                    finally:
                        os.close(ready_w)
                else:  # a subclass starts its sandboxes its own way
                    self._launch(sdir, spec, cg, netns, lsock.fileno())
                    launcher = None
                lsock.close()
                lsock = None
                info.state = "running"
                write_state(self.home, info)
                handle = NamespaceSandbox(self, info)
                handle._note_state_file()
                # The launcher exits right after forking; reap it while bwrap starts up.
                if launcher is not None and launcher.wait() != 0:
                    raise BackendError(f"launching the sandbox failed (exit {launcher.returncode})")
                if ready_r >= 0:
                    started = _wait_ready(ready_r)
                    os.close(ready_r)
                    ready_r = -1
                else:
                    started = _ping_sync(sock_path)
                if started:
                    break
                log = (sdir / "sandbox.log").read_text(errors="replace").strip()[-500:]
                if attempt == 2 or not log.startswith("bwrap:"):
                    raise BackendError(f"sandbox {sid} did not start: {log or 'no output'}")
                # bwrap's own setup failed (seen transiently while other tools remount /proc
                # on the host): clear what it left in the cgroup and start it once more.
                teardown.kill_sandbox(cg)
            if info.expires_at is not None:
                from rollbox.backends.reaper import ensure_reaper

                ensure_reaper(self.home)
            return handle
        except BaseException as exc:
            if lsock is not None:
                lsock.close()
            if ready_r >= 0:
                os.close(ready_r)
            try:
                self._teardown(info)
            except BackendError as left:  # the create's own error stays the one raised
                exc.add_note(f"and its teardown failed: {left}")
            raise

    def version_cached(self) -> str:
        """The tool version, computed once per process and backend class."""
        key = type(self).__name__
        if key not in _VERSIONS:
            _VERSIONS[key] = self.version()
        return _VERSIONS[key]

    def _launch(self, sdir: Path, spec: SandboxSpec, cg: Cgroup, netns: str, lfd: int) -> None:
        """Start the sandbox's runtime (blocking until the launcher has forked it off)."""
        proc = self._spawn(sdir, spec, cg, netns, lfd)
        if proc.wait() != 0:
            raise BackendError(f"launching the sandbox failed (exit {proc.returncode})")

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

    async def attach(self, sandbox_id: str) -> NamespaceSandbox:
        """Re-attach to a live sandbox of this home."""
        info = read_state(self.home, sandbox_id)
        if info.backend != self.name:
            raise SandboxNotFoundError(f"sandbox {sandbox_id} belongs to backend {info.backend}")
        if info.state == "destroyed":
            raise SandboxNotFoundError(f"sandbox {sandbox_id} was destroyed")
        return NamespaceSandbox(self, info)

    def list_sandboxes(self) -> list[SandboxInfo]:
        """Sandboxes of this backend in this home."""
        return list_states(self.home, self.name)

    def destroy_by_id(self, sandbox_id: str) -> list[str]:
        """Destroy a sandbox of this home by id (idempotent); see
        :meth:`Backend.destroy_by_id`. One line for the sandbox when anything of it was
        left (its state, cgroup, network and directory go together)."""
        try:
            info = read_state(self.home, sandbox_id)
        except SandboxNotFoundError:
            info = None
        existed = sandbox_dir(self.home, sandbox_id).exists()
        if info is None:
            self._teardown_names(sandbox_id, None)
        else:
            self._teardown(info)
        return [f"sandbox {sandbox_id}"] if existed else []

    def _teardown(self, info: SandboxInfo) -> None:
        net = info.extra.get("net")
        self._teardown_names(info.id, net if isinstance(net, dict) else None)

    def _teardown_names(self, sandbox_id: str, net: dict[str, object] | None) -> None:
        errors: list[str] = []
        cg = Cgroup.open(self.home.tag, sandbox_id)
        try:
            fast = teardown.kill_sandbox(cg) and teardown.remove_cgroup_dirs(cg)
            if not fast:
                cg.destroy()
        except (OSError, RollboxError) as exc:
            errors.append(f"cgroup: {exc}")
        if net is not None:
            netmod = _network_module()
            if netmod is not None:
                try:
                    netmod.teardown_network(netmod.NetSetup.from_dict(net))
                except (OSError, RollboxError) as exc:
                    errors.append(f"network: {exc}")
        try:
            sdir = sandbox_dir(self.home, sandbox_id)
            if not teardown.remove_rootfs(sdir):
                remove_sandbox_dir(sdir)
            # both delete with ignore_errors: say what stayed, and why
            left = teardown.why_not_removed(sdir) if sdir.exists() else None
            if left is not None:
                errors.append(f"dir: {left}")
        except (OSError, RollboxError) as exc:
            errors.append(f"dir: {exc}")
        if errors:
            raise TeardownError(
                f"destroying {sandbox_id} left resources: {'; '.join(errors)}",
                errors=[f"sandbox {sandbox_id}: {e}" for e in errors],
            )

    def cleanup_orphans(self, *, dry_run: bool = False) -> list[str]:
        """Destroy sandboxes whose owner died, whose TTL passed or that crashed, then
        remove tagged host resources that belong to no live sandbox."""
        lines: list[str] = []
        errors: list[str] = []
        live: set[str] = set()
        for info in self.list_sandboxes():
            reason = self._dead_reason(info)
            if reason is None:
                live.add(info.id)
                continue
            if not dry_run:
                try:
                    self._teardown(info)
                except BackendError as exc:  # reported, never counted as removed
                    errors += getattr(exc, "errors", None) or [f"sandbox {info.id}: {exc}"]
                    continue
            lines.append(f"sandbox {info.id} ({reason})")
        # Everything below is tagged with this home; keep what live sandboxes of *any*
        # backend of this home use (gVisor shares the cgroup and mount naming).
        live |= {i.id for i in list_states(self.home) if i.backend != self.name}
        lines += remove_orphan_cgroups(self.home.tag, live, dry_run)
        netmod = _network_module()
        if netmod is not None:
            lines += netmod.remove_orphan_networks(self.home.tag, live, dry_run)
        lines += remove_orphan_mounts(self.home, live, dry_run)
        lines += self._remove_stray_dirs(dry_run, errors)
        if errors:
            raise TeardownError(
                f"cleanup of {self.name} sandboxes left {len(errors)} resource(s)",
                errors=errors,
                removed=lines,
            )
        return lines

    def _remove_stray_dirs(self, dry_run: bool, errors: list[str]) -> list[str]:
        """Sandbox directories without a readable state.json (a creator killed between
        ``mkdir`` and the first state write), older than a minute."""
        out = []
        try:
            entries = list(os.scandir(self.home.sandboxes))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.name.startswith("sbx-") or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                read_state(self.home, entry.name)
                continue
            except SandboxNotFoundError:
                pass
            if time.time() - entry.stat(follow_symlinks=False).st_mtime < 60:
                continue
            if not dry_run:
                try:
                    remove_sandbox_dir(Path(entry.path))
                except (OSError, RollboxError) as exc:
                    errors.append(f"dir {entry.path}: {exc}")
                    continue
                left = teardown.why_not_removed(Path(entry.path))
                if left is not None:
                    errors.append(f"dir {left}")
                    continue
            out.append(f"dir {entry.path}")
        return out

    def _dead_reason(self, info: SandboxInfo) -> str | None:
        if info.state == "destroyed":
            return "destroyed"
        if expired(info):
            return "ttl expired"
        if owner_gone(info):
            return f"owner pid {info.owner_pid} is gone"
        if info.state == "creating":
            # A creator that died mid-create is caught by owner_gone; a detached one is
            # given a minute.
            age = (utcnow() - info.created_at).total_seconds()
            return "never finished starting" if age > 60 else None
        if (
            not Cgroup.open(self.home.tag, info.id).exists()
            or not (sandbox_dir(self.home, info.id) / "rootfs").is_dir()
        ):
            return "crashed"
        cg = Cgroup.open(self.home.tag, info.id)
        if not cg.pids():
            return "crashed (no processes)"
        return None


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
