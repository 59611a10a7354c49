"""The lifecycle shared by the ``namespace`` and ``gvisor`` backends.

Both run a sandbox as: a directory ``<home>/sandboxes/<id>`` holding ``state.json`` and an
overlay root (baseline layers + a tmpfs upper, :mod:`rollbox.backends.common.rootfs`), a
host cgroup, optionally an allow-list network namespace, and the rollbox agent answering
on ``<sandbox>/run/agent.sock``. Only how the runtime is started differs (bwrap or
runsc): a subclass implements :meth:`OverlayBackend._start` (and ``prepare``/``version``),
and names its handle class in :attr:`OverlayBackend.sandbox_class`. Everything else --
create with its one retry, attach, destroy, the teardown that reports what stayed, and
``cleanup_orphans`` -- is here.
"""

from __future__ import annotations

import abc
import asyncio
import os
import shutil
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from rollbox.backends.agent.client import short_unix_path
from rollbox.backends.base import Backend
from rollbox.backends.common import network as netmod
from rollbox.backends.common import teardown
from rollbox.backends.common.cgroups import Cgroup, remove_orphan_cgroups
from rollbox.backends.common.rootfs import Rootfs, remove_orphan_mounts, remove_sandbox_dir
from rollbox.backends.config import BackendConfig
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
from rollbox.models import BaselineInfo, SandboxInfo, SandboxSpec, utcnow

if TYPE_CHECKING:
    from rollbox.backends.common.overlay_sandbox import OverlaySandbox

ALLOW_TOOLS = {"ip": "iproute2", "iptables": "iptables", "iptables-restore": "iptables"}
"""What allow-list networking runs on the host, and the Debian package holding it."""

_VERSIONS: dict[str, str] = {}
"""Per backend class: its tool's version string, asked once per process."""


class Starting(Protocol):
    """A runtime that was started: :meth:`wait` tells whether its agent came up."""

    def wait(self) -> bool:
        """Block until the agent answers (True) or cannot any more (False).

        Raises:
            BackendError: the runtime's launcher failed.
        """

    def close(self) -> None:
        """Release what :meth:`wait` would have used (idempotent)."""


class Started:
    """A runtime whose start already waited for its agent: :meth:`wait` pings once more."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock

    def wait(self) -> bool:
        """Whether the agent answers on the socket."""
        return ping_agent(self.sock)

    def close(self) -> None:
        """Nothing to release."""


def ping_agent(path: Path, timeout: float = 10.0) -> bool:
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


def require_allow_tools() -> None:
    """Refuse allow-list networking before anything starts when its host tools are missing.

    Raises:
        BackendUnavailableError: naming the tools and the packages to install.
    """
    missing = [tool for tool in ALLOW_TOOLS if shutil.which(tool) is None]
    if missing:
        packages = sorted({ALLOW_TOOLS[t] for t in missing})
        raise BackendUnavailableError(
            f"allow-list networking needs {', '.join(missing)} on the host",
            hint=f"apt-get install {' '.join(packages)}",
        )


class OverlayBackend(Backend):
    """A backend whose sandboxes are an overlay root, a cgroup and an agent socket on the
    host; subclasses say how the runtime starts."""

    sandbox_class: ClassVar[type[OverlaySandbox]]
    """The handle class of this backend's sandboxes."""

    def __init__(
        self, home: Home, *, detached: bool = False, config: BackendConfig | None = None
    ) -> None:
        super().__init__(home, detached=detached, config=config)
        self._agent: Path | None = None

    # ------------------------------------------------------------------ hooks

    @abc.abstractmethod
    def _start(self, sdir: Path, spec: SandboxSpec, cg: Cgroup, netns: str, lfd: int) -> Starting:
        """Start the runtime of the sandbox in ``sdir`` (blocking at most until it forked).

        Args:
            sdir: the sandbox directory (``rootfs`` mounted, ``run/`` made).
            spec: the sandbox's spec.
            cg: its host cgroup (limits applied).
            netns: the path of its network namespace, or ``-`` for a new empty one.
            lfd: the listening socket the host made at ``run/agent.sock`` (a runtime that
                cannot inherit it binds its own there).

        Returns:
            What to wait on for the agent.
        """

    def _prepare_cgroup(self, cg: Cgroup, spec: SandboxSpec) -> None:
        """Set up ``cg`` beyond the spec's limits before the runtime starts (default: no)."""

    def _retryable(self, log: str) -> bool:
        """Whether a start that failed with ``log`` may be tried once more (default: no)."""
        return False

    def version_cached(self) -> str:
        """The tool version, computed once per process and backend class."""
        key = type(self).__name__
        if key not in _VERSIONS:
            _VERSIONS[key] = self.version()
        return _VERSIONS[key]

    # ------------------------------------------------------------------ checks

    def check(self, spec: SandboxSpec) -> None:
        """Preflight: network mode, limits, host tools and the hostname before anything
        starts."""
        super().check(spec)
        from rollbox.backends.common.cgroups import check_limits

        check_limits(spec.limits)
        from rollbox.backends.common.hostlimits import check_disk

        check_disk(spec.limits, "tmpfs")  # the writable layer is a tmpfs
        if spec.network.mode == "allow":
            require_allow_tools()
        if not spec.hostname or len(spec.hostname) > 63 or "/" in spec.hostname:
            raise InvalidInputError(f"bad hostname {spec.hostname!r}")

    # ------------------------------------------------------------------ sandboxes

    async def create(self, spec: SandboxSpec, baseline: BaselineInfo) -> OverlaySandbox:
        """Create and start a sandbox; see :meth:`Backend.create`."""
        return await asyncio.to_thread(self._create_sync, spec, baseline, None)

    def _create_sync(
        self, spec: SandboxSpec, baseline: BaselineInfo, upper_from: Path | None
    ) -> OverlaySandbox:
        from rollbox.baselines.store import BaselineStore

        self.check(spec)
        self.prepare()
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
        starting: Starting | None = None
        try:
            layers = BaselineStore(self.home).layer_dirs(baseline.digest)
            Rootfs.mount(sdir, layers, spec.limits.disk_mb, upper_from=upper_from)
            cg = Cgroup.create(self.home.tag, sid, spec.limits)
            self._prepare_cgroup(cg, spec)
            netns = "-"
            if spec.network.mode == "allow":
                net = netmod.setup_network(self.home.tag, sid, spec.network)
                info.extra["net"] = net.to_dict()
                netns = str(net.netns_path)
            sock_path = sdir / "run" / "agent.sock"
            for attempt in (1, 2):
                sock_path.unlink(missing_ok=True)
                lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                with short_unix_path(sock_path) as bind_path:
                    lsock.bind(bind_path)
                lsock.listen(64)
                starting = self._start(sdir, spec, cg, netns, lsock.fileno())
                lsock.close()
                lsock = None
                info.state = "running"
                write_state(self.home, info)
                handle = self.sandbox_class(self, info)
                handle._note_state_file()
                started = starting.wait()
                starting.close()
                starting = None
                if started:
                    break
                log = (sdir / "sandbox.log").read_text(errors="replace").strip()[-500:]
                if attempt == 2 or not self._retryable(log):
                    raise BackendError(f"sandbox {sid} did not start: {log or 'no output'}")
                # a transient start failure: clear what it left in the cgroup, once more
                teardown.kill_sandbox(cg)
            if info.expires_at is not None:
                from rollbox.backends.reaper import ensure_reaper

                ensure_reaper(self.home)
            return handle
        except BaseException as exc:
            if lsock is not None:
                lsock.close()
            if starting is not None:
                starting.close()
            try:
                self._teardown(info)
            except BackendError as left:  # the create's own error stays the one raised
                exc.add_note(f"and its teardown failed: {left}")
            raise

    async def attach(self, sandbox_id: str) -> OverlaySandbox:
        """Re-attach to a live sandbox of this home."""
        info = read_state(self.home, sandbox_id)
        if info.backend != self.name:
            raise SandboxNotFoundError(f"sandbox {sandbox_id} belongs to backend {info.backend}")
        if info.state == "destroyed":
            raise SandboxNotFoundError(f"sandbox {sandbox_id} was destroyed")
        return self.sandbox_class(self, info)

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

    # ------------------------------------------------------------------ teardown

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
    "ALLOW_TOOLS",
    "OverlayBackend",
    "Started",
    "Starting",
    "ping_agent",
    "require_allow_tools",
]
