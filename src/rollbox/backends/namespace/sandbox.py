"""A live ``namespace`` sandbox: exec through the agent, each command in its own cgroup
(everything else is the shared :class:`~rollbox.backends.common.overlay_sandbox.OverlaySandbox`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING

from rollbox.backends.agent.protocol import ExecRequest
from rollbox.backends.base import OutputCallback
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.common.execprep import (
    map_exec_error,
)
from rollbox.backends.common.overlay_sandbox import OverlaySandbox
from rollbox.backends.common.reasons import dir_full, pids_max_hits, tracked
from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.namespace.capture import StreamCapture
from rollbox.backends.namespace.launch import BOX
from rollbox.errors import (
    ExecTimeoutError,
    InvalidInputError,
    RollboxError,
    SandboxCrashedError,
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


class NamespaceSandbox(OverlaySandbox):
    """One live ``namespace`` sandbox."""

    backend: NamespaceBackend

    def __init__(self, backend: NamespaceBackend, info: SandboxInfo) -> None:
        super().__init__(backend, info)
        self._exec_seq = 0

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


__all__ = ["NamespaceSandbox", "_shielded_kill"]
