"""The microVM sandbox handle: exec, pause/resume, destroy.

An exec is one request to the guest agent (output streamed back in frames); the verifier's
isolated execs add a ``private`` field (:func:`_private_request`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from typing import Any

from rollbox.backends.agent.protocol import decode_collected
from rollbox.backends.base import (
    OutputCallback,
)
from rollbox.backends.common.capture import StreamCapture
from rollbox.backends.common.execprep import (
    PreparedExec,
    map_exec_error,
    prepare_exec,
    user_files,
)
from rollbox.backends.common.reasons import is_full, tracked
from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.microvm import qemu
from rollbox.backends.microvm.guest_agent import T_DATA, T_EOF, T_ERR, T_IN, T_OUT, frame, jframe
from rollbox.backends.microvm.sandbox_base import raise_agent_error
from rollbox.backends.microvm.sandbox_snapshots import VMSandboxSnapshots
from rollbox.errors import (
    BackendError,
    CapabilityError,
    ExecTimeoutError,
    RollboxError,
)
from rollbox.models import (
    ExecResult,
)


class MicroVMSandbox(VMSandboxSnapshots):
    """One microVM sandbox."""

    async def _prepare(self, cmd: list[str] | str, **kw: Any) -> PreparedExec:
        """The exec checked and resolved by the shared helper; /etc/passwd (and /etc/group
        for a group name) is read from the guest only for a user other than root."""
        texts: dict[str, str] = {}
        for path in user_files(self._info, kw.get("user")):
            with contextlib.suppress(RollboxError, OSError):
                texts[path] = (await self.read_file(path)).decode(errors="replace")
        passwd, group = texts.get("/etc/passwd"), texts.get("/etc/group")
        return prepare_exec(self._info, cmd, passwd=passwd, group=group, **kw)

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
        prep = await self._prepare(
            cmd, cwd=cwd, env=env, secrets=secrets, stdin=stdin, timeout=timeout, user=user
        )
        limits = self._info.spec.limits
        req = {
            "op": "exec",
            "argv": prep.argv,
            "env": prep.env,
            "cwd": prep.cwd,
            # the guest agent switches to it itself (supplementary groups from its /etc/group)
            "user": prep.user.spec or "root",
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
        masks = prep.secret_values
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
            e = reply["error"]
            failure = map_exec_error(
                e.get("type"), str(e.get("message", "")), sandbox_id=self.id, prepared=prep
            )
            if failure is not None:
                raise failure
            raise_agent_error(e)
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
