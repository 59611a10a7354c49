"""A live ``namespace`` sandbox: state, exec, files, snapshot, fork, pause, destroy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbox.backends.agent.client import AgentClient
from rollbox.backends.agent.protocol import ExecRequest
from rollbox.backends.base import OutputCallback, SandboxHandle
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.common.copylinks import LinkPolicy
from rollbox.backends.common.execprep import (
    PreparedExec,
    base_env,
    map_exec_error,
    prepare_exec,
    user_files,
)
from rollbox.backends.common.reasons import dir_full, pids_max_hits, tracked
from rollbox.backends.common.rootfiles import RootFiles
from rollbox.backends.common.rootfs import Rootfs
from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.namespace.capture import StreamCapture
from rollbox.backends.namespace.launch import BOX
from rollbox.backends.state import (
    read_state,
    sandbox_dir,
    write_state,
)
from rollbox.errors import (
    ExecTimeoutError,
    InvalidInputError,
    RollboxError,
    SandboxCrashedError,
    SandboxNotFoundError,
    SandboxStateError,
)
from rollbox.models import ExecResult, SandboxInfo

if TYPE_CHECKING:
    from rollbox.backends.namespace.backend import NamespaceBackend


async def _shielded_kill(xcg: Cgroup) -> None:
    """Kill an exec's cgroup in a thread, to the end even when the caller is cancelled."""
    kill = asyncio.ensure_future(asyncio.to_thread(xcg.kill_all))
    while not kill.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(kill)
    with contextlib.suppress(OSError, RollboxError):
        kill.result()


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

    def _prepare(self, cmd: list[str] | str, **kw: Any) -> PreparedExec:
        """The exec checked and resolved by the shared helper (/etc/passwd read from the
        host side, only for a user other than root)."""
        texts: dict[str, str] = {}
        for path in user_files(self.info, kw.get("user")):
            with contextlib.suppress(RollboxError, OSError):
                texts[path] = self.files.read(path).decode(errors="replace")
        passwd, group = texts.get("/etc/passwd"), texts.get("/etc/group")
        return prepare_exec(self.info, cmd, passwd=passwd, group=group, **kw)

    def _resolve_user(self, user: str | None) -> tuple[int | None, int, str]:
        """(uid or None for root, gid, home) of ``user``; kept for gVisor's exec until it
        moves onto :meth:`_prepare`."""
        who = self._prepare(["true"], user=user).user
        return who.uid, who.gid, who.home

    def _base_env(self, homedir: str) -> dict[str, str]:
        """See :func:`rollbox.backends.common.execprep.base_env` (kept for gVisor's exec)."""
        return base_env(self.info, homedir)

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
        if isolate is not None:
            isolate.check()
        prep = self._prepare(
            cmd, cwd=cwd, env=env, secrets=secrets, stdin=stdin, timeout=timeout, user=user
        )
        argv = prep.argv
        spec = self.info.spec
        req = ExecRequest(
            argv=argv,
            env=prep.env,
            cwd=prep.cwd,
            uid=prep.user.uid,
            gid=prep.user.gid,
            nofile=spec.limits.nofile or 0,
            stdin=prep.stdin,
            isolate=isolate,
        )
        secret_values = prep.secret_values
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
        failure = map_exec_error(
            agent_exit.fail_stage, agent_exit.fail_message(), sandbox_id=self.id, prepared=prep
        )
        if failure is not None:
            raise failure
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
