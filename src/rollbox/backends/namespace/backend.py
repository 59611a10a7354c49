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
import contextlib
import fcntl
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
from rollbox.backends.agent.client import AgentClient, short_unix_path
from rollbox.backends.agent.protocol import ExecRequest
from rollbox.backends.base import Backend, OutputCallback, SandboxHandle, command_argv
from rollbox.backends.common.bundle import DEFAULT_CAPS
from rollbox.backends.common.cgroups import Cgroup, remove_orphan_cgroups
from rollbox.backends.common.copylinks import LinkPolicy
from rollbox.backends.common.reasons import dir_full, pids_max_hits, tracked
from rollbox.backends.common.rootfs import Rootfs, remove_orphan_mounts, remove_sandbox_dir
from rollbox.backends.config import BackendConfig
from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.namespace import teardown
from rollbox.backends.namespace.capture import StreamCapture
from rollbox.backends.namespace.files import RootFiles
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
    ExecTimeoutError,
    InvalidInputError,
    RollboxError,
    SandboxCrashedError,
    SandboxNotFoundError,
    SandboxStateError,
    TeardownError,
)
from rollbox.ids import new_id
from rollbox.models import BaselineInfo, Capabilities, ExecResult, SandboxInfo, SandboxSpec, utcnow

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUN_TMPFS_BYTES = 16 << 20
# Docker's default capability set without CAP_MKNOD (no device nodes in the rootfs, so the
# host never opens a device through a sandbox path); the same set the gVisor bundle gets.
CAPS = DEFAULT_CAPS


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


async def _shielded_kill(xcg: Cgroup) -> None:
    """Kill an exec's cgroup in a thread, to the end even when the caller is cancelled."""
    kill = asyncio.ensure_future(asyncio.to_thread(xcg.kill_all))
    while not kill.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(kill)
    with contextlib.suppress(OSError, RollboxError):
        kill.result()


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


def _ping_sync(path: Path, timeout: float = 10.0) -> bool:
    """Ping the agent with a blocking socket (used from worker threads)."""
    from rollbox.backends.agent import protocol as p

    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            with short_unix_path(path) as short:
                s.connect(short)
            s.sendall(p.frame(p.PING))
            data = b""
            while len(data) < p.HEADER.size and time.monotonic() < deadline:
                chunk = s.recv(64)
                if not chunk:
                    return False
                data += chunk
            return data[:1] == p.PONG
        except OSError:
            return False


class NamespaceSandbox(SandboxHandle):
    """One live ``namespace`` sandbox."""

    def __init__(self, backend: NamespaceBackend, info: SandboxInfo) -> None:
        self.backend = backend
        self.home = backend.home
        self._info = info
        self.dir = sandbox_dir(self.home, info.id)
        self.cgroup = Cgroup.open(self.home.tag, info.id)
        self.rootfs = Rootfs.open(self.dir)
        self.files = RootFiles(self.rootfs.root)
        self.client = AgentClient(self.dir / "run" / "agent.sock")
        self._exec_seq = 0
        self._state_key: tuple[int, int, int] | None = None

    @property
    def info(self) -> SandboxInfo:
        """The sandbox's state record."""
        return self._info

    def _note_state_file(self) -> None:
        """Remember state.json as just written from ``self._info``, so the first file or
        exec call does not parse it back (one model validation per sandbox saved)."""
        try:
            st = os.stat(self.dir / "state.json")
        except FileNotFoundError:
            return
        self._state_key = (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> SandboxInfo:
        # Another process may have paused or destroyed the sandbox: re-read state.json,
        # but only when it changed (a stat instead of a parse on every exec).
        try:
            st = os.stat(self.dir / "state.json")
        except FileNotFoundError:
            self._info = self._info.model_copy(update={"state": "destroyed"})
            return self._info
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._state_key:
            try:
                self._info = read_state(self.home, self.id)
                self._state_key = key
            except SandboxNotFoundError:
                self._info = self._info.model_copy(update={"state": "destroyed"})
        return self._info

    def _require_running(self) -> None:
        state = self._refresh().state
        if state == "destroyed":
            raise SandboxStateError(f"sandbox {self.id} is destroyed")
        if state == "paused":
            raise SandboxStateError(f"sandbox {self.id} is paused", hint="resume it first")
        if state != "running":
            raise SandboxStateError(f"sandbox {self.id} is {state}")

    def _require_live(self) -> None:
        if self._refresh().state == "destroyed":
            raise SandboxStateError(f"sandbox {self.id} is destroyed")

    # ------------------------------------------------------------------ exec

    def _resolve_user(self, user: str | None) -> tuple[int | None, int, str]:
        """(uid or None for root-as-is, gid, home directory) of ``user`` inside."""
        if user is None or user in ("", "root", "0", "0:0"):
            return None, 0, "/root"
        name, _, group = user.partition(":")
        passwd: list[list[str]] = []
        with contextlib.suppress(RollboxError, OSError):
            text = self.files.read("/etc/passwd").decode(errors="replace")
            passwd = [line.split(":") for line in text.splitlines() if line.count(":") >= 6]
        uid: int | None = None
        gid = -1
        homedir = "/"
        for entry in passwd:
            if entry[0] == name or (name.isdigit() and entry[2] == name):
                uid, gid, homedir = int(entry[2]), int(entry[3]), entry[5] or "/"
                break
        if uid is None:
            if not name.isdigit():
                raise InvalidInputError(
                    f"no user {name!r} in the sandbox's /etc/passwd", hint="use a numeric uid"
                )
            uid = int(name)
            gid = uid
        if group:
            if not group.isdigit():
                raise InvalidInputError(f"group must be numeric in user {user!r}")
            gid = int(group)
        return uid, gid, homedir

    def _base_env(self, homedir: str) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOME": homedir, "HOSTNAME": self.info.spec.hostname}
        image_env = self.info.extra.get("image_env")
        if isinstance(image_env, list):
            for item in image_env:
                k, sep, v = str(item).partition("=")
                if sep:
                    env[k] = v
        env.update(self.info.spec.env)
        return env

    @tracked
    async def exec(
        self,
        cmd: list[str] | str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        user: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        isolate: IsolatedExec | None = None,
    ) -> ExecResult:
        """Run a command inside; see :meth:`SandboxHandle.exec`."""
        self._require_running()
        argv = command_argv(cmd)
        if isolate is not None:
            isolate.check()
        if timeout is not None and timeout <= 0:
            raise InvalidInputError("timeout must be > 0")
        spec = self.info.spec
        default_user = (
            spec.user if spec.user is not None else str(self.info.extra.get("image_user") or "")
        )
        uid, gid, homedir = self._resolve_user(user if user is not None else default_user)
        full_env = self._base_env(homedir)
        full_env.update(env or {})
        full_env.update(secrets or {})
        req = ExecRequest(
            argv=argv,
            env=full_env,
            cwd=cwd or spec.workdir or str(self.info.extra.get("image_workdir") or "/"),
            uid=uid,
            gid=gid,
            nofile=spec.limits.nofile or 0,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            isolate=isolate,
        )
        secret_values = [v for v in (secrets or {}).values() if v]
        cap = spec.limits.output_bytes
        out = StreamCapture(cap, secret_values, on_stdout)
        err = StreamCapture(cap, secret_values, on_stderr)
        self._exec_seq += 1
        xname = f"{BOX}/x{os.getpid()}-{self._exec_seq}-{time.monotonic_ns() % 1000000}"
        xcg = self.cgroup.child(xname, ("pids", "freezer"))
        oom_before = self._oom_kills()
        pids_hit = False
        started = time.monotonic()

        # The command joins its own cgroups itself, through open cgroup.procs files passed
        # with the request (no pid round trip; the fds are close-on-exec inside).
        cg_fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in xcg.procs_files()]
        try:
            try:
                run = self.client.exec(
                    req, cgroup_fds=cg_fds, on_stdout=out.feed, on_stderr=err.feed
                )
                agent_exit = await (run if timeout is None else asyncio.wait_for(run, timeout))
            except asyncio.CancelledError:
                # Cancelled (e.g. a policy's own timeout, Ctrl-C): the command's tree must
                # not outlive the exec; the kill runs to completion even if cancelled again.
                await _shielded_kill(xcg)
                raise
            except TimeoutError:
                await asyncio.to_thread(xcg.kill_all)
                hit_reasons = self._limits_hit(oom_before, pids_max_hits(xcg) > 0).reasons
                raise ExecTimeoutError(
                    f"command timed out after {timeout:g}s (its process tree was killed)",
                    stdout=out.finish(),
                    stderr=err.finish(),
                    timeout=timeout,
                    reasons=list(hit_reasons),
                ) from None
            except ValueError as exc:
                raise InvalidInputError(f"bad command: {exc}") from None
        finally:
            for fd in cg_fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                pids_hit = pids_max_hits(xcg) > 0  # read before the group goes
            # Survivors (background daemons) keep their group until destroy.
            xcg.remove_if_empty()
        duration = time.monotonic() - started
        if agent_exit.fail_stage == "chdir":
            raise InvalidInputError(
                f"working directory {req.cwd!r} in the sandbox: {agent_exit.fail_message()}"
            )
        if agent_exit.fail_stage == "cgroup":
            raise BackendError(
                f"sandbox {self.id}: the command could not join its cgroup: "
                f"{agent_exit.fail_message()}"
            )
        if agent_exit.fail_stage == "user":
            raise InvalidInputError(f"cannot switch to user {user!r}: {agent_exit.fail_message()}")
        if agent_exit.fail_stage in ("private mounts", "restrict"):
            raise BackendError(
                f"sandbox {self.id}: {agent_exit.fail_stage}: {agent_exit.fail_message()}"
            )
        if agent_exit.fail_stage == "exec":
            err.feed(f"rollbox: {argv[0]}: {agent_exit.fail_message()}\n".encode())
        hit = self._limits_hit(oom_before, pids_hit)
        if not self.cgroup.exists():
            raise SandboxCrashedError(f"sandbox {self.id} died during the command")
        return ExecResult(
            exit_code=agent_exit.exit_code,
            stdout=out.finish(),
            stderr=err.finish(),
            duration_s=duration,
            oom_killed=hit.oom_killed,
            pids_exhausted=hit.pids_exhausted,
            disk_full=hit.disk_full,
            truncated=out.truncated or err.truncated,
        )

    def _limits_hit(self, oom_before: int, pids_hit: bool) -> ExecResult:
        """An ``ExecResult`` with only the limit flags of a command that just ended set
        (see :mod:`rollbox.backends.common.reasons`)."""
        disk = self.info.spec.limits.disk_mb is not None and dir_full(self.rootfs.upperfs)
        return ExecResult(
            exit_code=0,
            stdout="",
            stderr="",
            duration_s=0.0,
            oom_killed=self._oom_kills() > oom_before,
            pids_exhausted=pids_hit,
            disk_full=disk,
        )

    def _oom_kills(self) -> int:
        """OOM kills in the sandbox's group (any cgroup version)."""
        return self.cgroup.oom_kills()

    # ------------------------------------------------------------------ files

    async def read_file(self, path: str) -> bytes:
        """Read a file inside (resolved safely below the root)."""
        self._require_live()
        return await asyncio.to_thread(self.files.read, path)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write a file inside (parents made; resolved safely below the root)."""
        self._require_live()
        raw = data.encode() if isinstance(data, str) else data
        await asyncio.to_thread(self.files.write, path, raw, mode)

    async def upload(self, src: Path, dest: str) -> None:
        """Copy a host file or tree into the sandbox."""
        self._require_live()
        await asyncio.to_thread(self.files.upload, src, dest)

    async def download(self, src: str, dest: Path, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or tree out of the sandbox; see :meth:`SandboxHandle.download`."""
        self._require_live()
        await asyncio.to_thread(self.files.download, src, dest, links)

    # ------------------------------------------------------------------ snapshot / fork

    async def snapshot(self, *, name: str | None = None) -> str:
        """The current filesystem changes as a new baseline (parent recorded)."""
        self._require_live()
        return await asyncio.to_thread(self._snapshot_sync, name)

    def _snapshot_sync(self, name: str | None) -> str:
        from rollbox.baselines.store import BaselineStore
        from rollbox.models import SnapshotSource

        with self._frozen():
            info = BaselineStore(self.home).commit_snapshot(
                self.info.baseline,
                self.rootfs.upper,
                SnapshotSource(sandbox_id=self.id, backend=self.backend.name),
                name=name,
            )
        return info.digest

    @contextlib.contextmanager
    def _frozen(self) -> Any:
        was_frozen = self.cgroup.is_frozen()
        if not was_frozen:
            self.cgroup.freeze()
        try:
            yield
        finally:
            if not was_frozen:
                self.cgroup.thaw()

    async def fork(self, n: int) -> list[SandboxHandle]:
        """``n`` independent sandboxes seeded with a copy of this one's changes."""
        if n < 1:
            raise InvalidInputError("fork needs n >= 1")
        self._require_live()
        return await asyncio.to_thread(self._fork_sync, n)

    def _fork_sync(self, n: int) -> list[SandboxHandle]:
        from rollbox.baselines.store import BaselineStore

        baseline = BaselineStore(self.home).resolve(self.info.baseline)
        spec = self.info.spec.model_copy()
        out: list[SandboxHandle] = []
        try:
            with self._frozen():
                for _ in range(n):
                    out.append(self.backend._create_sync(spec, baseline, self.rootfs.upper))
        except BaseException:
            for h in out:
                assert isinstance(h, NamespaceSandbox)
                with contextlib.suppress(RollboxError):
                    self.backend._teardown(h.info)
            raise
        return out

    # ------------------------------------------------------------------ lifecycle

    async def pause(self) -> None:
        """Freeze every process inside."""
        self._require_running()
        await asyncio.to_thread(self.cgroup.freeze)
        self._set_state("paused")

    async def resume(self) -> None:
        """Thaw a paused sandbox."""
        state = self._refresh().state
        if state == "destroyed":
            raise SandboxStateError(f"sandbox {self.id} is destroyed")
        await asyncio.to_thread(self.cgroup.thaw)
        self._set_state("running")

    def _set_state(self, state: str) -> None:
        info = self._refresh().model_copy(update={"state": state})
        write_state(self.home, info)
        self._info = info

    async def destroy(self) -> None:
        """Kill everything inside and remove every host resource (idempotent)."""
        await asyncio.to_thread(self.destroy_sync)

    def destroy_sync(self) -> None:
        """Blocking :meth:`destroy`."""
        self.backend._teardown(self._info)
        self._info = self._info.model_copy(update={"state": "destroyed"})
