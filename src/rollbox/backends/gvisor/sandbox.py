"""A live ``gvisor`` sandbox: exec through the agent inside runsc, each command's process
tree found with ``runsc ps`` and killed with ``runsc kill``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from rollbox.backends.agent.protocol import ExecRequest
from rollbox.backends.base import OutputCallback
from rollbox.backends.common.capture import StreamCapture
from rollbox.backends.common.execprep import map_exec_error
from rollbox.backends.common.overlay_sandbox import OverlaySandbox
from rollbox.backends.common.reasons import dir_full, fork_failed, tracked
from rollbox.backends.gvisor.layout import (
    HELPER,
    MEMORY_OVERHEAD_MB,
    STATX_SHIM,
    runsc_root,
)
from rollbox.backends.isolation import IsolatedExec
from rollbox.errors import (
    CapabilityError,
    ExecTimeoutError,
    InvalidInputError,
    RollboxError,
    SandboxCrashedError,
    SandboxExhaustedError,
)
from rollbox.models import ExecResult, SandboxInfo

if TYPE_CHECKING:
    from rollbox.backends.gvisor.backend import GVisorBackend


def exec_victims(procs: list[tuple[int, int, str]], pid: int, other_execs: set[int]) -> list[int]:
    """The processes to kill for a timed-out exec whose command is ``pid``.

    Args:
        procs: ``(pid, ppid, command)`` of every process inside (``runsc ps``).
        pid: the exec's command (a child of its agent session).
        other_execs: command pids of other execs still running in the sandbox.

    Returns:
        ``pid`` and its descendants, plus orphans re-parented to PID 1 with a higher pid
        (started after the exec) that are not agent sessions, and their descendants --
        minus anything descending from ``other_execs``. Sorted; never PID 1.
    """
    children: dict[int, list[int]] = {}
    for p, pp, _cmd in procs:
        children.setdefault(pp, []).append(p)

    def tree(roots: list[int]) -> set[int]:
        out: set[int] = set()
        stack = list(roots)
        while stack:
            q = stack.pop()
            if q in out or q == 1:
                continue
            out.add(q)
            stack += children.get(q, [])
        return out

    protected = tree(sorted(other_execs))
    orphans = [p for p, pp, cmd in procs if pp == 1 and p > pid and cmd != "agent"]
    victims = tree([pid, *orphans]) - protected
    return sorted(victims & {p for p, _pp, _cmd in procs})


class GVisorSandbox(OverlaySandbox):
    """One live ``gvisor`` sandbox."""

    backend: GVisorBackend

    def __init__(self, backend: GVisorBackend, info: SandboxInfo) -> None:
        super().__init__(backend, info)
        self._running_pids: set[int] = set()

    async def _runsc(self, *args: str) -> tuple[int, str, str]:
        argv = ["runsc", "--root", str(runsc_root(self.home)), *args]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def _host_pids_hit(self) -> int:
        """How often the host pids limit of the sandbox's cgroup was reached."""
        try:
            text = (self.cgroup.paths["pids"] / "pids.events").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
        return 0

    async def processes(self) -> list[tuple[int, int, str]]:
        """``(pid, ppid, command)`` of every process inside (gVisor pids), via ``runsc ps``."""
        rc, out, err = await self._runsc("ps", self.id)
        if rc != 0:
            raise SandboxCrashedError(f"runsc ps {self.id} failed: {err.strip()[-200:]}")
        procs = []
        for line in out.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[1].isdigit() and parts[2].isdigit():
                procs.append((int(parts[1]), int(parts[2]), parts[7]))
        return procs

    async def kill_tree(self, pid: int) -> list[int]:
        """SIGKILL the exec whose command is gVisor pid ``pid``: its descendants and the
        daemons it left behind (orphans re-parented to PID 1 that were started after it,
        i.e. with a higher pid, and that do not descend from another running exec).

        Returns:
            The pids killed.
        """
        killed: list[int] = []
        for _ in range(10):
            procs = await self.processes()
            victims = exec_victims(procs, pid, self._running_pids - {pid})
            if not victims:
                break
            await asyncio.gather(
                *(self._runsc("kill", "--pid", str(v), self.id, "KILL") for v in victims)
            )
            killed += victims
        return killed

    def _disk_full(self) -> bool:
        return self.info.spec.limits.disk_mb is not None and dir_full(self.rootfs.upperfs)

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
        prep = self._prepare(
            cmd, cwd=cwd, env=env, secrets=secrets, stdin=stdin, timeout=timeout, user=user
        )
        argv = prep.argv
        if isolate is not None and (isolate.fresh or isolate.files or isolate.collect):
            # runsc 20221219: a command's unshare(CLONE_NEWNS) mounts show in every process's
            # mount table, so a private directory cannot be made here.
            raise CapabilityError("gvisor cannot give one exec a private mount namespace")
        if self.info.spec.limits.pids is not None:
            # RLIMIT_NPROC per exec (see uds_listen.c): gVisor enforces it for root without
            # CAP_SYS_RESOURCE/CAP_SYS_ADMIN, which the bundle drops.
            argv = [HELPER, "--nproc", str(self.info.spec.limits.pids), "--", *argv]
        spec = self.info.spec
        full_env = dict(prep.env)
        preload = full_env.get("LD_PRELOAD")
        full_env["LD_PRELOAD"] = f"{STATX_SHIM}:{preload}" if preload else STATX_SHIM
        req = ExecRequest(
            argv=argv,
            env=full_env,
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
        oom_before = self.cgroup.oom_kills()
        pids_hit_before = self._host_pids_hit()
        started = time.monotonic()
        gpid: list[int] = []

        async def on_pid(pid: int) -> None:
            gpid.append(pid)
            self._running_pids.add(pid)

        try:
            agent_exit = await asyncio.wait_for(
                self.client.exec(req, on_pid=on_pid, on_stdout=out.feed, on_stderr=err.feed),
                timeout,
            )
        except asyncio.CancelledError:
            # Cancelled, not timed out: kill the command's tree all the same.
            if gpid:
                kill = asyncio.ensure_future(self.kill_tree(gpid[0]))
                while not kill.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(kill)
                with contextlib.suppress(RollboxError, OSError):
                    kill.result()
            raise
        except TimeoutError:
            if gpid:
                try:
                    await self.kill_tree(gpid[0])
                except SandboxCrashedError:
                    # The sandbox died meanwhile (e.g. its host task limit was reached).
                    self._set_state("crashed")
                    if self._host_pids_hit() > pids_hit_before:
                        raise SandboxExhaustedError(
                            f"sandbox {self.id} died during a command that timed out: gVisor "
                            f"reached its host task limit ({spec.limits.pids} processes "
                            "inside; a fork bomb?)",
                            reason="pids_exhausted",
                        ) from None
                    raise SandboxCrashedError(
                        f"sandbox {self.id} died during a command that timed out"
                    ) from None
            stderr = err.finish()
            raise ExecTimeoutError(
                f"command timed out after {timeout:g}s (its process tree was killed)",
                stdout=out.finish(),
                stderr=stderr,
                timeout=timeout,
                reasons=[
                    *(["pids_exhausted"] if fork_failed(stderr) else []),
                    *(["disk_full"] if self._disk_full() else []),
                ],
            ) from None
        except ValueError as exc:
            raise InvalidInputError(f"bad command: {exc}") from None
        except SandboxCrashedError:
            if self.cgroup.oom_kills() <= oom_before:
                if self._host_pids_hit() > pids_hit_before:
                    self._set_state("crashed")
                    raise SandboxExhaustedError(
                        f"sandbox {self.id} died: gVisor reached its host task limit "
                        f"({spec.limits.pids} processes inside; a fork bomb?)",
                        reason="pids_exhausted",
                    ) from None
                raise
            # gVisor has no OOM killer of its own: the host cgroup's kills the sentry, and
            # the whole sandbox with it. Report it as the command's OOM kill.
            self._set_state("crashed")
            err.feed(
                f"rollbox: the gVisor sandbox was OOM-killed at its memory limit "
                f"({spec.limits.memory_mb} MiB + {MEMORY_OVERHEAD_MB} MiB for gVisor itself); "
                "the sandbox is gone\n".encode()
            )
            return ExecResult(
                exit_code=137,
                stdout=out.finish(),
                stderr=err.finish(),
                duration_s=time.monotonic() - started,
                oom_killed=True,
                truncated=out.truncated or err.truncated,
            )
        finally:
            for p in gpid:
                self._running_pids.discard(p)
        duration = time.monotonic() - started
        failure = map_exec_error(
            agent_exit.fail_stage, agent_exit.fail_message(), sandbox_id=self.id, prepared=prep
        )
        if failure is not None:
            raise failure
        if agent_exit.fail_stage == "exec":
            err.feed(f"rollbox: {argv[0]}: {agent_exit.fail_message()}\n".encode())
        oom = self.cgroup.oom_kills() > oom_before
        stderr = err.finish()
        return ExecResult(
            exit_code=agent_exit.exit_code,
            stdout=out.finish(),
            stderr=stderr,
            duration_s=duration,
            oom_killed=oom,
            # RLIMIT_NPROC inside gVisor leaves no counter to read: the fork failure the
            # command's shell (or Python) reported is the evidence.
            pids_exhausted=fork_failed(stderr),
            disk_full=self._disk_full(),
            truncated=out.truncated or err.truncated,
        )


__all__ = ["GVisorSandbox", "exec_victims"]
