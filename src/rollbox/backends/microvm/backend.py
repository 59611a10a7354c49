"""The ``microvm`` backend: every sandbox is its own QEMU ``microvm`` guest.

See the package docstring for the moving parts. A sandbox's host-side footprint:
``sandboxes/<id>/`` (state.json, console.log, its qcow2 disk(s)), the runtime dir
``/run/rbx/<tag>/<id>/`` (QMP and agent sockets, pid file) and one QEMU process named
``rbx-<tag>-<id>``. ``destroy()`` removes all three; ``cleanup_orphans()`` finds them when
their owner died, their TTL passed or QEMU is gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import math
import os
import posixpath
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from rollbox.backends.agent.protocol import decode_collected
from rollbox.backends.base import (
    Backend,
    MemorySnapshots,
    OutputCallback,
    SandboxHandle,
    command_argv,
)
from rollbox.backends.common.copylinks import LinkPolicy, in_tree_text, resolve_lexically
from rollbox.backends.common.reasons import is_full, tracked
from rollbox.backends.config import BackendConfig, MicroVMConfig
from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.microvm import disk, memfile, probe, qemu
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.channel import AgentChannel, ChannelClosed
from rollbox.backends.microvm.guest_agent import T_DATA, T_EOF, T_ERR, T_IN, T_OUT, frame, jframe
from rollbox.backends.microvm.initramfs import ensure_initramfs
from rollbox.backends.microvm.kernel import GuestKernel, ensure_kernel
from rollbox.backends.namespace.files import normalize as root_relative
from rollbox.backends.namespace.teardown import why_not_removed
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
    CapabilityError,
    CorruptionError,
    ExecTimeoutError,
    InvalidInputError,
    IsADirectoryInSandboxError,
    LimitsError,
    NotFoundError,
    PathEscapeError,
    RollboxError,
    SandboxCrashedError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxStateError,
    TeardownError,
)
from rollbox.ids import new_id
from rollbox.models import (
    BaselineInfo,
    Capabilities,
    ExecResult,
    Limits,
    SandboxInfo,
    SandboxSpec,
    SnapshotSource,
    utcnow,
)

BOOT_TIMEOUT_S = float(os.environ.get("ROLLBOX_MICROVM_BOOT_TIMEOUT", "120"))
DEFAULT_DISK_MB = 4096
GUEST_OVERHEAD_MB = 160  # kernel, page cache and the agent, on top of the memory limit
MIN_MEMORY_MB = 32
MIN_DISK_MB = 16
PIPE_BYTES = 1 << 20  # fs.pipe-max-size default; larger needs CAP_SYS_RESOURCE
TEMPLATES = os.environ.get("ROLLBOX_MICROVM_BOOT_SNAPSHOTS", "1") != "0"
"""Create by restoring a boot snapshot of the same baseline and VM shape when one exists
(the first create of a shape boots cold and saves it)."""
SPLIT_MEMORY = os.environ.get("ROLLBOX_MICROVM_SPLIT_MEMORY", "1") != "0"
"""Save memory snapshots as a copy-on-write RAM image + device state (lazy restores)."""


def assets_home(home: Home) -> Home:
    """The home whose ``vm/`` caches derived VM assets (kernel, initramfs, per-digest disk
    images, boot snapshots): the one owning the layer store they derive from, so homes that
    share a store (symlinked ``layers/``) share them too."""
    return Home(Path(os.path.realpath(home.layers)).parent)


ROUTER_MAC = "02:72:62:78:00:01"  # locally administered


def _vm_network(home: Home, sandbox_id: str, spec: SandboxSpec) -> dict[str, str]:
    """For an ``allow`` sandbox: the same netns, veth pair and host firewall rules as a
    ``namespace`` sandbox gets, plus a tap device in that netns for QEMU's NIC, routed and
    masqueraded out of the netns's veth — so the host's allow-list rules see the VM's
    traffic exactly as a namespace sandbox's. Returns the setup (``NetSetup.to_dict``).

    Raises:
        InvalidInputError: an allow entry is not an IPv4 address.
        BackendError: a step failed (everything made so far is removed).
    """
    from rollbox.backends.common import network as netmod
    from rollbox.backends.microvm.initramfs import GUEST_IP, ROUTER_IP

    net = netmod.setup_network(home.tag, sandbox_id, spec.network)
    inside = ["nsenter", f"--net=/run/netns/{net.netns}"]
    tap = "\n".join(
        [
            "tuntap add dev tap0 mode tap",
            # one fixed router MAC: a VM restored from a snapshot keeps its ARP cache
            f"link set tap0 address {ROUTER_MAC}",
            f"addr add {ROUTER_IP}/30 dev tap0",
            "link set tap0 up",
        ]
    )
    steps: list[tuple[list[str], str | None]] = [
        (["ip", "-n", net.netns, "-batch", "-"], tap + "\n"),
        ([*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1"], None),
        ([*inside, "iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", f"{GUEST_IP}/32",
          "-o", net.sandbox_if, "-j", "MASQUERADE"], None),
    ]  # fmt: skip
    try:
        for argv, stdin in steps:
            r = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise BackendError(f"microvm network: {' '.join(argv)}: {r.stderr.strip()}")
    except BaseException:
        netmod.teardown_network(net)
        raise
    return net.to_dict()


def _teardown_vm_network(info: SandboxInfo) -> bool:
    net = info.extra.get("net")
    if not isinstance(net, dict):
        return False
    from rollbox.backends.common import network as netmod

    netmod.teardown_network(netmod.NetSetup.from_dict(net))
    return True


def _open_paths_of_qemus() -> set[str]:
    """Every file path a rollbox QEMU (any home) has open."""
    out: set[str] = set()
    for pid in qemu.find_processes("rbx-").values():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def normalize(path: str) -> str:
    """An absolute, lexically normalised sandbox path.

    Raises:
        PathEscapeError: ``..`` climbs above ``/``.
        InvalidInputError: empty or containing NUL.
    """
    return "/" + root_relative(path)


def _xlist(info: SandboxInfo, key: str) -> list[str]:
    value = info.extra.get(key)
    return [str(x) for x in value] if isinstance(value, list) else []


def _xint(info: SandboxInfo, key: str, default: int) -> int:
    value = info.extra.get(key)
    return value if isinstance(value, int) else default


def _host_cgroup(home: Home, sandbox_id: str, spec: SandboxSpec, pid: int) -> None:
    """Put the QEMU process in the sandbox's host cgroup ``rollbox-<tag>/<id>``: its CPU
    quota is the sandbox's ``cpus`` (fractions hold for VMs too), and leak checks and
    ``rollbox cleanup`` see the VM like any other sandbox's processes."""
    from rollbox.backends.common.cgroups import Cgroup

    lim = Limits(cpus=spec.limits.cpus, memory_mb=None, pids=None, disk_mb=None, nofile=None)
    cg = Cgroup.create(home.tag, sandbox_id, lim)
    cg.add(pid)


def _drop_host_cgroup(home: Home, sandbox_id: str) -> bool:
    from rollbox.backends.common.cgroups import Cgroup

    cg = Cgroup.open(home.tag, sandbox_id)
    if not cg.exists():
        return False
    cg.destroy()
    return True


def _configure_args(spec: SandboxSpec, full_command_caps: bool = False) -> dict[str, Any]:
    return {
        "hostname": spec.hostname,
        "memory_max": (spec.limits.memory_mb or 0) << 20,
        "pids_max": spec.limits.pids,
        "full_command_caps": full_command_caps,
    }


def _raise_agent_error(err: dict[str, Any], path: str = "") -> None:
    kind = err.get("type")
    msg = err.get("message", "")
    if kind == "escape":
        raise PathEscapeError(f"sandbox path {path or msg!r} resolves outside the sandbox root")
    if kind == "not_found":
        raise SandboxFileNotFoundError(f"no such file in the sandbox: {path or msg}")
    if kind == "is_dir":
        raise IsADirectoryInSandboxError(f"{path}: {msg}")
    if kind in ("not_dir", "user"):
        raise InvalidInputError(f"{msg}" if kind == "user" else f"{path}: {msg}")
    if kind == "nopython":  # the baseline lacks what this operation needs in the guest
        raise InvalidInputError(msg)
    raise BackendError(f"guest agent: {msg}")


class MicroVMSandbox(SandboxHandle):
    """One microVM sandbox."""

    def __init__(self, backend: MicroVMBackend, info: SandboxInfo) -> None:
        self.backend = backend
        self._info = info
        self._ch: AgentChannel | None = None
        self._users = 0
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ plumbing
    @property
    def info(self) -> SandboxInfo:
        return self._info

    @property
    def home(self) -> Home:
        return self.backend.home

    @property
    def dir(self) -> Path:
        return sandbox_dir(self.home, self.id)

    @property
    def rdir(self) -> Path:
        return Path(str(self._info.extra["run_dir"]))

    @property
    def vm(self) -> qemu.VMConfig:
        vm = self._info.extra["vm"]
        assert isinstance(vm, dict)
        return qemu.VMConfig.from_json(vm)

    @property
    def pid(self) -> int | None:
        pid = self._info.extra.get("qemu_pid")
        return int(pid) if isinstance(pid, int) else None

    def alive(self) -> bool:
        """True while this sandbox's QEMU runs."""
        return qemu.alive(self.pid, self.vm.name)

    def _save(self) -> None:
        write_state(self.home, self._info)

    def _refresh(self) -> None:
        with contextlib.suppress(SandboxNotFoundError):
            self._info = read_state(self.home, self.id)

    def _usable(self, *, allow_paused: bool = False) -> None:
        self._refresh()
        if self._info.state == "destroyed" or not self.dir.exists():
            raise SandboxStateError(f"sandbox {self.id} is destroyed")
        if self._info.state == "paused" and not allow_paused:
            raise SandboxStateError(f"sandbox {self.id} is paused", hint="resume it first")
        if not self.alive():
            self._crashed()

    def _crashed(self) -> None:
        if self.dir.exists():
            self._info.state = "crashed"
            with contextlib.suppress(OSError):
                self._save()
        tail = self.console_tail()
        raise SandboxCrashedError(
            f"the VM of sandbox {self.id} is gone (QEMU pid {self.pid} died)"
            + (f": {tail}" if tail else "")
        )

    def console_tail(self) -> str:
        """The last line the guest printed on its console, if any."""
        try:
            lines = Path(self.vm.console_log).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][-300:] if lines else ""

    @contextlib.asynccontextmanager
    async def _session(self, timeout: float = 60.0) -> AsyncIterator[AgentChannel]:
        """The agent connection, shared by this handle's concurrent requests."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._ch is None or self._ch.closed:
                try:
                    self._ch = await AgentChannel.connect(
                        self.rdir / "agent.sock",
                        self.dir / "agent.lock",
                        timeout=timeout,
                        alive=self.alive,
                    )
                except ChannelClosed:
                    if not self.alive():
                        self._crashed()
                    raise
            self._users += 1
        ch = self._ch
        try:
            yield ch
        except ChannelClosed:
            if not self.alive():
                self._crashed()
            raise
        finally:
            self._users -= 1
            if self._users == 0 and self._ch is ch:
                self._ch = None
                await ch.close()

    def _env(self, env: dict[str, str] | None, secrets: dict[str, str] | None) -> dict[str, str]:
        out: dict[str, str] = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        }
        for item in _xlist(self._info, "image_env"):
            k, _, v = item.partition("=")
            out[k] = v
        out["HOSTNAME"] = self._info.spec.hostname
        out.update(self._info.spec.env)
        out.update(env or {})
        out.update(secrets or {})
        return out

    # ------------------------------------------------------------------ exec
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
        self._usable()
        argv = command_argv(cmd)
        spec = self._info.spec
        limits = spec.limits
        workdir = cwd or spec.workdir or str(self._info.extra.get("image_workdir") or "/")
        req = {
            "op": "exec",
            "argv": argv,
            "env": self._env(env, secrets),
            "cwd": normalize(workdir),
            "user": user or spec.user or str(self._info.extra.get("image_user") or "root"),
            "timeout": timeout,
            "nofile": limits.nofile,
            "output_bytes": limits.output_bytes,
            "stdin": stdin is not None,
        }
        if isolate is not None:
            req["private"] = _private_request(isolate)
            if isolate.timeout_s is not None:
                # the guest's own deadline: it kills the command's cgroup, then the collected
                # files and the reply (timed_out) still come back
                req["timeout"] = isolate.timeout_s
        # the same capture as the namespace backend: capped, secrets masked even when a
        # secret is split across two streamed chunks
        from rollbox.backends.namespace.capture import StreamCapture

        masks = [v for v in (secrets or {}).values() if v]
        caps = {
            T_OUT: StreamCapture(limits.output_bytes, masks, on_stdout),
            T_ERR: StreamCapture(limits.output_bytes, masks, on_stderr),
        }

        def on_frame(kind: int, payload: bytes) -> None:
            if kind in caps:
                caps[kind].feed(payload)
            elif kind == T_DATA and isolate is not None:
                rel, _mode, full, data = decode_collected(payload)
                isolate.add_collected(rel, data, full)

        t0 = time.monotonic()
        async with self._session() as ch:
            rid = ch.new_id()
            await ch.send(jframe({"id": rid, **req}))
            if stdin is not None:
                data = stdin.encode() if isinstance(stdin, str) else stdin
                for i in range(0, len(data), 65536):
                    await ch.send(frame(T_IN, rid, data[i : i + 65536]))
                await ch.send(frame(T_EOF, rid, b""))
            guard = None if timeout is None else timeout + 30.0
            try:
                reply = await asyncio.wait_for(ch.reply(rid, on_frame), guard)
            except TimeoutError:
                raise BackendError(f"sandbox {self.id}: the guest agent stopped answering")
            except asyncio.CancelledError:
                # Cancelled: the guest agent kills the command's tree (its cgroup).
                kill = asyncio.ensure_future(asyncio.wait_for(ch.call("kill", target=rid), 10))
                while not kill.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(kill)
                with contextlib.suppress(Exception):
                    kill.result()
                ch.queues.pop(rid, None)
                raise
        duration = time.monotonic() - t0
        if "error" in reply:
            _raise_agent_error(reply["error"])
        stdout, stderr = caps[T_OUT].finish(), caps[T_ERR].finish()
        # the guest agent reports the exec's cgroup events and the root's free space
        disk_full = limits.disk_mb is not None and is_full(
            int(reply.get("disk_free", -1)), int(reply.get("disk_total", -1))
        )
        flags = {
            "oom_killed": bool(reply.get("oom_killed")),
            "pids_exhausted": bool(reply.get("pids_exhausted")),
            "disk_full": disk_full,
        }
        if reply.get("timed_out") and isolate is not None and isolate.timeout_s is not None:
            isolate.timed_out = True  # its own deadline: a result, as on the namespace backend
        elif reply.get("timed_out"):
            raise ExecTimeoutError(
                f"command timed out after {timeout:g}s in sandbox {self.id}",
                stdout=stdout,
                stderr=stderr,
                timeout=timeout,
                reasons=[k for k, v in flags.items() if v],
            )
        return ExecResult(
            exit_code=int(reply["exit_code"]),
            stdout=stdout,
            stderr=stderr,
            duration_s=duration,
            oom_killed=flags["oom_killed"],
            pids_exhausted=flags["pids_exhausted"],
            disk_full=flags["disk_full"],
            truncated=bool(reply.get("truncated"))
            or caps[T_OUT].truncated
            or caps[T_ERR].truncated,
        )

    # ------------------------------------------------------------------ files
    async def _fetch(self, op: str, path: str, sink: Callable[[bytes], object]) -> None:
        async with self._session() as ch:
            rid = ch.new_id()
            await ch.send(jframe({"id": rid, "op": op, "path": path}))

            def on_frame(kind: int, payload: bytes) -> None:
                if kind == T_DATA:
                    sink(payload)

            reply = await ch.reply(rid, on_frame)
        if "error" in reply:
            _raise_agent_error(reply["error"], path)

    async def _push(self, req: dict[str, Any], data: bytes, path: str) -> None:
        async with self._session() as ch:
            rid = ch.new_id()
            await ch.send(jframe({"id": rid, **req}))
            await ch.send_data(rid, data)
            reply = await ch.reply(rid)
        if "error" in reply:
            _raise_agent_error(reply["error"], path)

    async def read_file(self, path: str) -> bytes:
        p = normalize(path)
        self._usable()
        buf = bytearray()
        await self._fetch("read_file", p, buf.extend)
        return bytes(buf)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        p = normalize(path)
        if p == "/":
            raise InvalidInputError("cannot write a file at /")
        self._usable()
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._push({"op": "write_file", "path": p, "mode": mode}, raw, p)

    async def upload(self, src: Path, dest: str) -> None:
        p = normalize(dest)
        self._usable()
        if not src.exists() and not src.is_symlink():
            raise NotFoundError(f"no such host path: {src}")
        if src.is_file() and not src.is_symlink():
            await self.write_file(p, src.read_bytes(), mode=src.stat().st_mode & 0o7777)
            return
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for child in sorted(src.iterdir()) if src.is_dir() else [src]:
                    tar.add(child, arcname=child.name)
            f.seek(0)
            await self._push({"op": "put_tar", "dest": p}, f.read(), p)

    async def download(self, src: str, dest: Path, *, links: LinkPolicy = "refuse") -> None:
        """Copy a file or tree out; the contract of :mod:`~rollbox.backends.common.copylinks`
        (the guest resolves paths with chroot semantics; the host rewrites or refuses links
        in the extracted tree before anything reaches ``dest``)."""
        p = normalize(src)
        await self._download(p, dest, links, 0, posixpath.basename(p) or "root")

    async def _download(self, p: str, dest: Path, links: LinkPolicy, depth: int, name: str) -> None:
        """``name``: what ``src`` is called (a link's own name, not its target's)."""
        if depth > 40:  # as the kernel's ELOOP: links (content mode) leading round
            raise PathEscapeError(f"{p}: too many levels of symlinks in the sandbox")
        self._usable()
        async with self._session() as ch:
            st = await ch.call("stat", path=p)  # lstat in the guest: C, no helper process
        if "error" in st:
            _raise_agent_error(st["error"], p)
        if not st.get("exists"):
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {p}")
        if st.get("link"):  # follow it inside the sandbox (the guest's own root)
            await self._download(str(st["realpath"]), dest, links, depth + 1, name)
            return
        if st.get("reg"):  # a single file: read by the C agent, no tar helper
            buf = bytearray()
            await self._fetch("read_file", p, buf.extend)
            if dest.is_dir() and not dest.is_symlink():
                dest = dest / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink():  # never write through a host link
                dest.unlink()
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(buf)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, int(st.get("mode", 0o644)) & 0o777)
            finally:
                os.close(fd)
            return
        if not st.get("dir") and "reg" in st:  # ("reg" missing: an agent from before it)
            raise InvalidInputError(f"{p} is not a regular file or directory in the sandbox")
        self.home.tmp.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.home.tmp) as f:
            await self._fetch("get_tar", p, f.write)
            f.seek(0)
            with tempfile.TemporaryDirectory(dir=self.home.tmp) as stage:
                _safe_extract(f, Path(stage))
                entries = os.listdir(stage)
                if len(entries) != 1:
                    raise BackendError(f"download of {p}: unexpected archive from the guest")
                item = Path(stage) / entries[0]
                if item.is_symlink():  # src itself is a link: follow it inside the sandbox
                    pointed = resolve_lexically(p, os.readlink(item))
                    await self._download(pointed, dest, links, depth + 1, name)
                    return
                if item.is_dir():
                    await self._fix_links(item, p, p, links, depth)
                if dest.is_dir() and not dest.is_symlink() and item.is_dir():
                    dest = dest / name if dest.exists() and any(dest.iterdir()) else dest
                dest.parent.mkdir(parents=True, exist_ok=True)
                if item.is_dir():
                    shutil.copytree(item, dest, symlinks=True, dirs_exist_ok=True)
                else:
                    if dest.is_dir() and not dest.is_symlink():
                        dest = dest / name
                    if dest.is_symlink():  # never write through a host link
                        dest.unlink()
                    os.replace(item, dest) if not dest.exists() else shutil.move(item, dest)

    async def _fix_links(
        self, stage: Path, where: str, top: str, links: LinkPolicy, depth: int
    ) -> None:
        """Links in an extracted tree: in-tree ones rewritten relative, others refused or
        replaced by what they point to (fetched from the guest)."""
        for entry in sorted(os.scandir(stage), key=lambda e: e.name):
            sub = posixpath.join(where, entry.name)
            if entry.is_symlink():
                text = os.readlink(entry.path)
                os.unlink(entry.path)
                rel_text = in_tree_text(sub, text, top)
                if rel_text is not None:
                    os.symlink(rel_text, entry.path)
                elif links == "refuse":
                    raise PathEscapeError(
                        f"{sub} in the sandbox is a link out of the copied tree (-> {text})",
                        hint="copy it with links='content' (CLI: --links content) to get "
                        "what it points to",
                    )
                else:
                    with contextlib.suppress(NotFoundError):  # a dangling link is left out
                        await self._download(
                            resolve_lexically(sub, text),
                            Path(entry.path),
                            links,
                            depth + 1,
                            entry.name,
                        )
            elif entry.is_dir(follow_symlinks=False):
                await self._fix_links(Path(entry.path), sub, top, links, depth)

    # ------------------------------------------------------------------ snapshots
    async def snapshot(self, *, name: str | None = None) -> str:
        """The guest's filesystem changes as a new baseline (parent recorded)."""
        self._usable()
        return await self._fs_snapshot(name)

    async def snapshot_memory(self) -> str:
        """RAM + devices + frozen disk; see :meth:`SandboxHandle.snapshot_memory`."""
        return (await self.memory_snapshot()).id

    async def _fs_snapshot(self, name: str | None) -> str:
        from rollbox.baselines.layers import convert_oci_whiteouts
        from rollbox.baselines.store import BaselineStore

        self.home.tmp.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.home.tmp) as f:
            await self._fetch("fs_diff", "/", f.write)
            f.seek(0)
            with tempfile.TemporaryDirectory(dir=self.home.tmp, prefix="vmsnap-") as stage:
                upper = Path(stage) / "upper"
                upper.mkdir()
                await asyncio.to_thread(_safe_extract, f, upper)
                await asyncio.to_thread(convert_oci_whiteouts, upper)
                store = BaselineStore(self.home)
                info = await asyncio.to_thread(
                    store.commit_snapshot,
                    self._info.baseline,
                    upper,
                    SnapshotSource(sandbox_id=self.id, backend="microvm"),
                    name,
                )
        return info.digest

    async def memory_snapshot(self, *, ephemeral: bool = False) -> snaps.MemorySnapshot:
        """Pause, save RAM and devices to a file, freeze the disk, resume.

        Returns:
            The snapshot record (its id restores with ``SandboxSpec.from_snapshot``).
        """
        self._usable()
        async with self._session() as ch:
            await ch.call("quiesce", drop_caches=True)
        return await asyncio.to_thread(self._memory_snapshot_sync, ephemeral)

    def _memory_snapshot_sync(
        self, ephemeral: bool, template_dir: Path | None = None
    ) -> snaps.MemorySnapshot:
        snap_id = new_id("snap")
        sdir = template_dir or snaps.snap_dir(self.home, snap_id)
        sdir.mkdir(parents=True, exist_ok=template_dir is not None)
        vm = self.vm
        index = _xint(self._info, "disk_index", 0)
        new_disk = self.dir / f"disk-{index + 1}.qcow2"
        mem = sdir / "memory.bin"
        # a boot snapshot's disk gets a unique name: a rebuilt one must never take the path
        # that running sandboxes' overlays name as their backing file
        frozen = sdir / (f"disk-{snap_id}.qcow2" if template_dir else "disk.qcow2")
        ok = False
        try:
            with qemu.QMP(self.rdir / "qmp.sock") as mon:
                mon.execute("stop")
                try:
                    fd = os.open(mem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    try:
                        socket.send_fds(
                            mon.sock,
                            [b'{"execute": "getfd", "arguments": {"fdname": "snap"}}\n'],
                            [fd],
                        )
                        while True:
                            msg = mon._read()
                            if "return" in msg:
                                break
                            if "error" in msg:
                                raise BackendError(f"qemu getfd: {msg['error']}")
                    finally:
                        os.close(fd)
                    mon.execute("migrate", uri="fd:snap")
                    mon.wait_migration()
                    # freeze the disk: the file so far becomes the snapshot's, read-only;
                    # the VM continues on a new overlay stacked on it
                    os.link(vm.disk, frozen)
                    os.chmod(frozen, 0o444)
                    disk.create_overlay(new_disk, frozen, "qcow2", size_mb=self._disk_mb())
                    mon.execute(
                        "blockdev-snapshot-sync",
                        device="upper",
                        **{"snapshot-file": str(new_disk), "format": "qcow2", "mode": "existing"},
                    )
                finally:
                    mon.execute("cont")
            layout, size, sha, ram = self._store_memory(
                mem, sdir, self.backend.vm_config.split_memory
            )
            old_disk = vm.disk
            vm.disk = str(new_disk)
            self._info.extra["vm"] = vm.to_json()
            self._info.extra["disk_index"] = index + 1
            self._save()
            with contextlib.suppress(OSError):
                os.unlink(old_disk)  # the snapshot dir holds the other link
            chain = _xlist(self._info, "snapshot_chain")
            record = snaps.MemorySnapshot(
                id=snap_id,
                source=self.id,
                baseline=self._info.baseline,
                vm=vm.to_json() | {"disk": str(frozen)},
                memory_size=size,
                memory_sha256=sha,
                layout=layout,
                ram_size=ram.ram_size if ram else 0,
                ram_digest=ram.ram_digest if ram else "",
                ram_stat=snaps.fingerprint(sdir / "ram.img") if ram else [],
                disk_mb=self._disk_mb(),
                accelerator=vm.accel,
                kernel=str(self._info.extra.get("kernel", "")),
                chain=chain,
                ephemeral=ephemeral,
                spec=self._info.spec.model_dump(mode="json"),
            )
            snaps.save(self.home, record, sdir)
            if template_dir is None:
                self._info.extra["snapshot_chain"] = [*chain, snap_id]
                self._save()
            ok = True
            return record
        finally:
            if not ok and template_dir is None:
                shutil.rmtree(sdir, ignore_errors=True)
            elif not ok:  # keep older disks of the boot snapshot: sandboxes stack on them
                snaps.remove_memory(sdir)
                with contextlib.suppress(OSError):
                    os.unlink(frozen)

    @staticmethod
    def _store_memory(
        mem: Path, sdir: Path, split: bool = SPLIT_MEMORY
    ) -> tuple[str, int, str, memfile.Split | None]:
        """Split the saved stream into RAM image + state (or keep it whole when the
        splitter does not understand it); returns (layout, stream size, stream sha256,
        split)."""
        if split:
            for name in ("ram.img", "state.bin"):  # a boot snapshot rewritten in place
                with contextlib.suppress(OSError):
                    os.unlink(sdir / name)
            try:
                res = memfile.split(mem, sdir / "ram.img", sdir / "state.bin")
            except memfile.UnsupportedStream:
                pass
            else:
                os.unlink(mem)
                return "split", res.state_size, res.state_sha256, res
        return "stream", mem.stat().st_size, snaps.sha256_file(mem), None

    def _save_template(self, tpl_dir: Path) -> None:
        """Save this freshly booted, not yet configured VM as the boot snapshot later
        creates of the same shape restore from (one writer; others skip)."""
        import fcntl

        if (tpl_dir / "meta.json").exists():
            return
        tpl_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(tpl_dir.parent / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            if (tpl_dir / "meta.json").exists():
                return
            # written in place (the running VM's new overlay names the frozen disk by its
            # final path); readers only trust the dir once meta.json, written last, exists
            snaps.remove_memory(tpl_dir)
            self._memory_snapshot_sync(False, template_dir=tpl_dir)
            self._info.extra["boot_snapshot"] = tpl_dir.name
            self._save()

    def _disk_mb(self) -> int:
        return _xint(self._info, "disk_mb", DEFAULT_DISK_MB)

    async def fork(self, n: int) -> list[SandboxHandle]:
        if n < 1:
            raise InvalidInputError("fork needs n >= 1")
        self._usable()
        snap = await self.memory_snapshot(ephemeral=True)
        try:
            made = await self.backend.restore_many(snap, n, self._info.spec)
        finally:
            # branches keep the frozen disk (and map the RAM image they started from);
            # the memory files are no longer needed
            snaps.remove_memory(snaps.snap_dir(self.home, snap.id))
        return list(made)

    # ------------------------------------------------------------------ lifecycle
    async def pause(self) -> None:
        self._usable()
        await asyncio.to_thread(self._monitor, "stop")
        self._info.state = "paused"
        self._save()

    async def resume(self) -> None:
        self._usable(allow_paused=True)
        await asyncio.to_thread(self._monitor, "cont")
        self._info.state = "running"
        self._save()

    def _monitor(self, cmd: str) -> None:
        with qemu.QMP(self.rdir / "qmp.sock") as mon:
            mon.execute(cmd)

    async def destroy(self) -> None:
        if self._ch is not None:
            with contextlib.suppress(Exception):
                await self._ch.close()
            self._ch = None
        await asyncio.to_thread(self.backend.destroy_by_id, self.id)
        self._info.state = "destroyed"


def _safe_extract(f: Any, dest: Path) -> None:
    """Extract a tar produced by the (untrusted) guest: no absolute paths, no ``..``, no
    links leaving ``dest``, no device nodes; modes and owners kept."""

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        if member.isdev():
            raise tarfile.FilterError(f"device node {member.name!r} refused")
        checked = tarfile.tar_filter(member, path)
        return checked.replace(mode=member.mode, deep=False)

    with tarfile.open(fileobj=f, mode="r|") as tar:
        tar.extractall(dest, filter=keep, numeric_owner=True)


@register_backend
class MicroVMBackend(Backend, MemorySnapshots):
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

    # ------------------------------------------------------------------ create
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

    async def create(self, spec: SandboxSpec, baseline: BaselineInfo) -> SandboxHandle:
        self.check(spec)
        if spec.from_snapshot:
            snap = snaps.load(self.home, spec.from_snapshot)
            return (await self.restore_many(snap, 1, spec))[0]
        self.prepare()
        assert self._kernel is not None and self._initrd is not None
        from rollbox.baselines.store import BaselineStore

        layers = BaselineStore(self.home).layer_dirs(baseline.digest)
        assets = assets_home(self.home)
        base = await asyncio.to_thread(disk.ensure_base_image, assets, baseline.digest, layers)
        disk_mb = spec.limits.disk_mb or DEFAULT_DISK_MB
        template = await asyncio.to_thread(disk.ensure_upper_template, assets, disk_mb)
        mem = (spec.limits.memory_mb or 1024) + GUEST_OVERHEAD_MB
        accel = self.accelerator
        cpus = max(1, math.ceil(spec.limits.cpus or 1))
        nic = spec.network.mode == "allow"
        tpl_dir = self._template_dir(
            assets, baseline.digest, mem, cpus, disk_mb, str(self._initrd), nic
        )
        if self.vm_config.boot_snapshots and (tpl_dir / "meta.json").is_file():
            try:
                rec = snaps.MemorySnapshot.model_validate_json((tpl_dir / "meta.json").read_text())
                return await self._restore(rec, spec, template=(tpl_dir, baseline))
            except CorruptionError:
                # rebuilt by this cold boot; its disk stays (running sandboxes stack on it)
                with contextlib.suppress(OSError):
                    os.unlink(tpl_dir / "meta.json")
                snaps.remove_memory(tpl_dir)
        sid = new_id("sbx")
        info = self._new_info(spec, baseline.digest, sid)
        d = sandbox_dir(self.home, sid)
        d.mkdir(parents=True)
        rdir = qemu.run_dir(self.home.tag, sid)
        vm = qemu.VMConfig(
            name=qemu.proc_name(self.home.tag, sid),
            accel=accel.accelerator,
            memory_mb=mem,
            cpus=cpus,
            kernel=str(self._kernel.vmlinuz),
            initrd=str(self._initrd),
            base_image=str(base),
            disk=str(d / "disk-0.qcow2"),
            run_dir=str(rdir),
            console_log=str(d / "console.log"),
            nic=nic,
            tb_mb=self.vm_config.tb_mb,
            aslr=self.vm_config.aslr,
        )
        info.accelerator = accel.accelerator
        info.extra.update(
            run_dir=str(rdir),
            vm=vm.to_json(),
            disk_index=0,
            disk_mb=disk_mb,
            kernel=self._kernel.version,
            kernel_package=self._kernel.package_version,
            accelerator_reason=accel.reason,
            image_env=list(baseline.config.env),
            image_workdir=baseline.config.workdir,
            image_user=baseline.config.user,
        )
        write_state(self.home, info)
        handle = MicroVMSandbox(self, info)
        try:
            if nic:
                net = await asyncio.to_thread(_vm_network, self.home, sid, spec)
                info.extra["net"] = net
                vm.netns = net["netns"]
                info.extra["vm"] = vm.to_json()
                write_state(self.home, info)
            await asyncio.to_thread(disk.create_overlay, Path(vm.disk), template, "raw")
            info.extra["qemu_pid"] = pid = await asyncio.to_thread(qemu.start, vm)
            write_state(self.home, info)
            await asyncio.to_thread(_host_cgroup, self.home, sid, spec, pid)
            async with handle._session(timeout=self.vm_config.boot_timeout_s) as ch:
                if self.vm_config.boot_snapshots and not (tpl_dir / "meta.json").exists():
                    await ch.call("quiesce", drop_caches=True)
            if self.vm_config.boot_snapshots:
                await asyncio.to_thread(handle._save_template, tpl_dir)
            async with handle._session(timeout=self.vm_config.boot_timeout_s) as ch:
                await ch.call("configure", **_configure_args(spec, self.full_command_caps))
            info.state = "running"
            write_state(self.home, info)
        except BaseException as exc:
            tail = handle.console_tail()
            await self._undo_create(sid, exc)
            if isinstance(exc, SandboxCrashedError | ChannelClosed) and tail:
                raise BackendError(f"the microVM did not boot: {tail}") from None
            raise
        self._after_create(info)
        return handle

    def _template_dir(
        self,
        assets: Home,
        digest: str,
        mem: int,
        cpus: int,
        disk_mb: int,
        initrd: str,
        nic: bool,
    ) -> Path:
        """Where the boot snapshot for this device model and baseline lives."""
        import hashlib
        import json

        from rollbox.backends.microvm.guest_agent import AGENT_VERSION

        key = json.dumps(
            [
                digest,
                mem,
                cpus,
                disk_mb,
                qemu.host_tsc_khz(),
                AGENT_VERSION,
                qemu.BASE_APPEND,
                qemu.tcg_append(self.vm_config.aslr),
                initrd,
                *(["nic"] if nic else []),  # keeps the keys of NIC-less shapes unchanged
            ],
            sort_keys=True,
        )
        return assets.vm / "boot" / hashlib.sha256(key.encode()).hexdigest()[:32]

    def _after_create(self, info: SandboxInfo) -> None:
        if info.expires_at is not None:
            from rollbox.backends.reaper import ensure_reaper

            ensure_reaper(self.home)

    async def restore_many(
        self, snap: snaps.MemorySnapshot, n: int, spec: SandboxSpec
    ) -> list[MicroVMSandbox]:
        """``n`` sandboxes restored from ``snap`` in parallel (each on its own overlay)."""
        results = await asyncio.gather(
            *(self._restore(snap, spec) for _ in range(n)), return_exceptions=True
        )
        made = [r for r in results if isinstance(r, MicroVMSandbox)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for h in made:
                await h.destroy()
            raise errors[0]
        return made

    async def _restore(
        self,
        snap: snaps.MemorySnapshot,
        spec: SandboxSpec,
        *,
        template: tuple[Path, BaselineInfo] | None = None,
    ) -> MicroVMSandbox:
        """One sandbox restored from ``snap``; with ``template`` (its dir and the baseline),
        a fresh sandbox of ``spec`` from a boot snapshot instead of a user's snapshot."""
        self.prepare()
        sdir = template[0] if template else snaps.snap_dir(self.home, snap.id)
        mem_file = snaps.check_size(self.home, snap, sdir)
        sid = new_id("sbx")
        if template is None:
            # a restored sandbox keeps the snapshot's device model, baseline and settings
            base_spec = SandboxSpec.model_validate(snap.spec) if snap.spec else spec
            spec = base_spec.model_copy(
                update={"from_snapshot": snap.id, "labels": spec.labels or base_spec.labels,
                        "ttl_s": spec.ttl_s}
            )  # fmt: skip
        info = self._new_info(spec, snap.baseline, sid)
        d = sandbox_dir(self.home, sid)
        d.mkdir(parents=True)
        rdir = qemu.run_dir(self.home.tag, sid)
        vm = qemu.VMConfig.from_json(dict(snap.vm))
        vm.name = qemu.proc_name(self.home.tag, sid)
        vm.disk = str(d / "disk-0.qcow2")
        vm.run_dir = str(rdir)
        vm.console_log = str(d / "console.log")
        vm.mem_file = str(sdir / "ram.img") if snap.layout == "split" else ""
        info.accelerator = vm.accel
        info.extra.update(
            run_dir=str(rdir),
            vm=vm.to_json(),
            disk_index=0,
            disk_mb=snap.disk_mb,
            kernel=snap.kernel,
        )
        if template is None:
            info.extra.update(snapshot=snap.id, snapshot_chain=[*snap.chain, snap.id])
            src = self._src_extra(snap.source)
            for key in ("image_env", "image_workdir", "image_user", "kernel_package"):
                if key in src:
                    info.extra[key] = src[key]
        else:
            cfg = template[1].config
            info.extra.update(
                boot_snapshot=sdir.name,
                kernel_package=self._kernel.package_version if self._kernel else "",
                image_env=list(cfg.env),
                image_workdir=cfg.workdir,
                image_user=cfg.user,
            )
        write_state(self.home, info)
        handle = MicroVMSandbox(self, info)
        try:
            if vm.nic:  # the snapshot's VM had a NIC: this branch gets its own network
                net = await asyncio.to_thread(_vm_network, self.home, sid, spec)
                info.extra["net"] = net
                vm.netns = net["netns"]
                info.extra["vm"] = vm.to_json()
                write_state(self.home, info)
            await asyncio.to_thread(
                disk.create_overlay, Path(vm.disk), Path(str(snap.vm["disk"])), "qcow2"
            )
            await asyncio.to_thread(self._load_memory, info, vm, mem_file, snap)
            write_state(self.home, info)
            async with handle._session(timeout=self.vm_config.boot_timeout_s) as ch:
                await ch.call(
                    "restored",
                    time_ns=time.time_ns(),
                    entropy=base64.b64encode(os.urandom(64)).decode(),
                )
                if template is not None:
                    await ch.call("configure", **_configure_args(spec, self.full_command_caps))
            info.state = "running"
            write_state(self.home, info)
        except BaseException as exc:
            await self._undo_create(sid, exc)
            raise
        self._after_create(info)
        return handle

    async def _undo_create(self, sid: str, exc: BaseException) -> None:
        """Destroy a sandbox whose create failed; what that left is noted on ``exc`` (the
        create's own error stays the one raised)."""
        try:
            await asyncio.to_thread(self.destroy_by_id, sid)
        except TeardownError as left:
            exc.add_note(f"and its teardown failed: {left}")

    def _src_extra(self, source: str) -> dict[str, object]:
        with contextlib.suppress(SandboxNotFoundError):
            return read_state(self.home, source).extra
        return {}

    def _load_memory(
        self, info: SandboxInfo, vm: qemu.VMConfig, mem_file: Path, snap: snaps.MemorySnapshot
    ) -> None:
        """Start QEMU paused with ``-incoming fd:``, stream the file in while hashing it,
        and let the VM run only if the hash matches."""
        r, w = os.pipe()
        # a 1 MiB pipe instead of 64 KiB: fewer wake-ups of QEMU and of the feeder per MB
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        try:
            pid = qemu.start(vm, incoming=f"fd:{r}", pass_fds=(r,))
        finally:
            os.close(r)
        info.extra["qemu_pid"] = pid
        write_state(self.home, info)
        _host_cgroup(self.home, info.id, info.spec, pid)
        digest: list[str] = []

        def feed() -> None:
            import hashlib

            h = hashlib.sha256()
            writing = True
            try:
                with open(mem_file, "rb") as f:
                    while block := f.read(1 << 20):
                        h.update(block)
                        view = memoryview(block)
                        while writing and view:
                            try:
                                n = os.write(w, view)
                            except OSError:  # QEMU gave up; keep hashing to tell why
                                writing = False
                                break
                            view = view[n:]
            except OSError:
                pass
            finally:
                os.close(w)
                digest.append(h.hexdigest())
            if snap.layout == "split":
                # checked while QEMU loads the state; the guest runs only if it matches
                try:
                    ram = Path(vm.mem_file)
                    if snap.ram_stat and snaps.fingerprint(ram) == snap.ram_stat:
                        digest.append(snap.ram_digest)  # unchanged since it was hashed
                    else:
                        digest.append(memfile.ram_digest(ram))
                except OSError:
                    digest.append("unreadable")

        t = threading.Thread(target=feed, daemon=True)
        t.start()
        deadline = time.monotonic() + self.vm_config.boot_timeout_s
        status = "unknown"
        mon: qemu.QMP | None = None
        try:
            mon = qemu.QMP(Path(vm.run_dir) / "qmp.sock")
            while True:
                status = mon.execute("query-status").get("status")
                if status != "inmigrate":
                    break
                if not qemu.alive(pid, vm.name) or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
        except (OSError, BackendError):
            status = "exited" if not qemu.alive(pid, vm.name) else "unreachable"
        try:
            t.join(timeout=60)
            # a corrupt stream may make QEMU quit mid-load; the hash says whether it was
            if not digest or digest[0] != snap.memory_sha256:
                raise CorruptionError(
                    f"memory snapshot {snap.id} does not match its recorded sha256; refused",
                    paths=[str(mem_file)],
                )
            if snap.layout == "split" and digest[1:] != [snap.ram_digest]:
                raise CorruptionError(
                    f"memory snapshot {snap.id}: its RAM image does not match the recorded "
                    "digest; refused",
                    paths=[vm.mem_file],
                )
            if mon is None or status not in ("paused", "prelaunch", "postmigrate"):
                raise BackendError(f"restore of {snap.id} failed (QEMU state {status})")
            mon.execute("cont")
        finally:
            if mon is not None:
                mon.close()

    # ------------------------------------------------------------------ attach / list
    async def attach(self, sandbox_id: str) -> SandboxHandle:
        info = read_state(self.home, sandbox_id)
        if info.backend != self.name or info.state == "destroyed":
            raise SandboxNotFoundError(f"no live microvm sandbox {sandbox_id!r}")
        return MicroVMSandbox(self, info)

    def list_sandboxes(self) -> list[SandboxInfo]:
        return list_states(self.home, self.name)

    # ------------------------------------------------------------------ teardown
    def destroy_by_id(self, sandbox_id: str) -> list[str]:
        """Kill the QEMU and remove every host resource of one sandbox (idempotent).

        Returns:
            One line per removed resource.

        Raises:
            TeardownError: something could not be removed (every other step still ran).
        """
        removed: list[str] = []
        errors: list[str] = []
        d = sandbox_dir(self.home, sandbox_id)
        name = qemu.proc_name(self.home.tag, sandbox_id)
        snap_id = None
        info = None
        try:
            info = read_state(self.home, sandbox_id)
            pid = info.extra.get("qemu_pid")
            snap_id = info.extra.get("snapshot")
        except SandboxNotFoundError:
            pid = None
        procs = qemu.find_processes(name)
        for pid_ in {*procs.values(), *([pid] if isinstance(pid, int) else [])}:
            if qemu.alive(pid_, name):
                qemu.kill(pid_, name)
                removed.append(f"process {pid_} ({name})")
        try:
            if info is not None and _teardown_vm_network(info):
                removed.append(f"network of {sandbox_id}")
        except (BackendError, OSError, KeyError, ValueError) as exc:  # incl. a bad record
            errors.append(f"network: {type(exc).__name__}: {exc}")
        try:
            if _drop_host_cgroup(self.home, sandbox_id):
                removed.append(f"cgroup rollbox-{self.home.tag}/{sandbox_id}")
        except (BackendError, OSError) as exc:
            errors.append(f"cgroup: {exc}")
        rdir = qemu.run_dir(self.home.tag, sandbox_id)
        for what, path in (("runtime dir", rdir), ("sandbox dir", d)):
            if path.exists():
                left = why_not_removed(path)
                if left is None:
                    removed.append(f"{what} {path}")
                else:
                    errors.append(f"{what}: {left}")
        with contextlib.suppress(OSError):
            rdir.parent.rmdir()
        if isinstance(snap_id, str):
            removed += self._drop_unused_snapshots()
        if errors:
            raise TeardownError(
                f"destroying {sandbox_id} left resources: {'; '.join(errors)}",
                errors=[f"sandbox {sandbox_id}: {e}" for e in errors],
                removed=removed,
            )
        return removed

    def list_snapshots(self) -> list[snaps.MemorySnapshot]:
        """The memory snapshots of this home."""
        return snaps.all_snapshots(self.home)

    @property
    def vm_config(self) -> MicroVMConfig:
        """:attr:`config` as the microVM's own model."""
        cfg = self.config
        if not isinstance(cfg, MicroVMConfig):
            raise InvalidInputError(f"a {cfg.type!r} config was given to backend 'microvm'")
        return cfg

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
            if snap_id in _xlist(i, "snapshot_chain")
        ]
        users += [r.id for r in snaps.all_snapshots(self.home) if snap_id in r.chain]
        if users:
            raise InUseError(
                f"memory snapshot {snap_id} is in use by {', '.join(users)}",
                hint="destroy those first",
            )
        snaps.remove(self.home, snap_id)

    def _drop_unused_snapshots(self, dry_run: bool = False) -> list[str]:
        """Ephemeral (fork) snapshots that no sandbox and no other snapshot uses."""
        used: set[str] = set()
        for info in list_states(self.home, self.name):
            used.update(_xlist(info, "snapshot_chain"))
        records = snaps.all_snapshots(self.home)
        for rec in records:
            used.update(rec.chain)
        out = []
        for rec in records:
            if rec.ephemeral and rec.id not in used:
                if not dry_run:
                    snaps.remove(self.home, rec.id)
                out.append(f"fork snapshot {rec.id}")
        return out

    def _drop_stale_boot_snapshots(self, dry_run: bool = False) -> list[str]:
        """Boot snapshots no create can use any more: their baseline left the store, or
        they were saved with another initramfs (agent or kernel changed). One whose files a
        running QEMU (of any home sharing these assets) still has open is kept: sandboxes
        stack on its frozen disk."""
        boot = assets_home(self.home).vm / "boot"
        if not boot.is_dir():
            return []
        from rollbox.baselines.store import BaselineStore

        store = BaselineStore(self.home)
        current = ""
        # boot snapshots exist, so the kernel and initramfs were built before: this is cheap
        with contextlib.suppress(RollboxError):
            self.prepare()
            current = str(self._initrd)
        in_use = _open_paths_of_qemus()
        out = []
        for d in sorted(boot.iterdir()):
            try:
                rec = snaps.MemorySnapshot.model_validate_json((d / "meta.json").read_text())
            except (OSError, ValueError):
                continue  # being written (meta.json comes last) or not a boot snapshot
            initrd = str(rec.vm.get("initrd", ""))
            why = ""
            if store.get(rec.baseline) is None:
                why = "its baseline is gone"
            elif current and initrd != current:
                why = "saved with an older guest agent or kernel"
            if not why or any(p.startswith(f"{d}/") for p in in_use):
                continue
            out.append(f"boot snapshot {d.name} ({why})")
            if not dry_run:
                shutil.rmtree(d, ignore_errors=True)
        return out

    def cleanup_orphans(self, *, dry_run: bool = False) -> list[str]:
        out: list[str] = []
        errors: list[str] = []
        live: set[str] = set()
        for info in self.list_sandboxes():
            pid = info.extra.get("qemu_pid")
            vm_name = qemu.proc_name(self.home.tag, info.id)
            dead = info.state in ("destroyed", "crashed") or (
                info.state != "creating"
                and not qemu.alive(pid if isinstance(pid, int) else None, vm_name)
            )
            if dead or owner_gone(info) or expired(info):
                why = (
                    "expired" if expired(info) else "owner gone" if owner_gone(info) else "VM gone"
                )
                if dry_run:
                    out.append(f"sandbox {info.id} ({why})")
                else:
                    try:
                        out += [f"{r} ({why})" for r in self.destroy_by_id(info.id)]
                    except TeardownError as exc:  # reported, not counted as removed
                        out += [f"{r} ({why})" for r in exc.removed]
                        errors += exc.errors
            else:
                live.add(info.id)
        # QEMUs and runtime dirs of this home that no sandbox record explains
        prefix = qemu.proc_name(self.home.tag, "")
        for name, pid in qemu.find_processes(prefix).items():
            sid = name[len(prefix) :]
            if sid not in live and not sandbox_dir(self.home, sid).exists():
                out.append(f"process {pid} ({name})")
                if not dry_run:
                    qemu.kill(pid, name)
        tag_dir = qemu.RUN_ROOT / self.home.tag
        if tag_dir.is_dir():
            for entry in tag_dir.iterdir():
                if entry.name not in live and not sandbox_dir(self.home, entry.name).exists():
                    out.append(f"runtime dir {entry}")
                    if not dry_run:
                        shutil.rmtree(entry, ignore_errors=True)
        sroot = snaps.root(self.home)
        if sroot.is_dir():
            for entry in sroot.iterdir():
                if not (entry / "meta.json").exists():
                    out.append(f"incomplete snapshot {entry}")
                    if not dry_run:
                        shutil.rmtree(entry, ignore_errors=True)
        out += self._drop_unused_snapshots(dry_run)
        out += self._drop_stale_boot_snapshots(dry_run)
        from rollbox.backends.common.cgroups import remove_orphan_cgroups

        # keep every live sandbox's group, of any backend (they share the home's parent)
        everyone = live | {i.id for i in list_states(self.home) if i.backend != self.name}
        out += remove_orphan_cgroups(self.home.tag, everyone, dry_run)
        from rollbox.backends.common.network import remove_orphan_networks

        out += remove_orphan_networks(self.home.tag, everyone, dry_run)
        if errors:
            raise TeardownError(
                f"cleanup of {self.name} sandboxes left {len(errors)} resource(s)",
                errors=errors,
                removed=out,
            )
        return out


PRIVATE_FILES_MAX = 700 << 10
"""Bytes of files a private exec may carry: they travel base64 in one JSON frame (1 MiB)."""


def _private_request(iso: IsolatedExec) -> dict[str, Any]:
    """The guest agent's ``private`` exec field for ``iso``.

    Raises:
        CapabilityError: the files do not fit in one request frame.
    """
    iso.check()
    if sum(len(data) for _mode, data in iso.files.values()) > PRIVATE_FILES_MAX:
        raise CapabilityError(
            f"microvm: files over {PRIVATE_FILES_MAX >> 10} KiB cannot be carried into a "
            "private mount namespace"
        )
    return {
        "fresh": list(iso.fresh),
        "files": [
            [path, mode, base64.b64encode(data).decode()]
            for path, (mode, data) in iso.files.items()
        ],
        "collect": iso.collect or "",
        "kill_others": iso.kill_others,
    }
