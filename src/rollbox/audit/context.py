"""What one audit sets up around its probes, and tears down afterwards.

* sandboxes, tracked and destroyed at the end whatever happens;
* host canaries the probes try to reach from inside: a directory with a secret file, a
  ``sleep`` process whose environment holds a secret, a TCP service on 127.0.0.1, an
  abstract unix socket;
* a network namespace made by the audit itself (``rba<tag><rand>``, veth to the host,
  addresses from 198.18.0.0/15 — the benchmarking range, never routed off this machine)
  with a TCP server on two ports, for the network probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.audit import leftovers
from rollbox.backends.common import testnet
from rollbox.config import Home
from rollbox.errors import BackendError, RollboxError
from rollbox.models import Limits, NetworkPolicy
from rollbox.sandbox import AsyncSandbox

MARK = "RBX-AUDIT "
"""Prefix of the one JSON line a probe program prints."""


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class ProbeError(Exception):
    """A probe could not run (its result would prove nothing)."""


def token(label: str) -> str:
    """A fresh random marker, e.g. ``rbxaudit-secret-3f9a…``."""
    return f"rbxaudit-{label}-{secrets.token_hex(8)}"


class NetnsServer(testnet.NetnsServer):
    """The audit's server in a network namespace it made: two random high ports, each
    answering its own fresh token."""

    @classmethod
    def for_audit(cls, tag: str) -> NetnsServer:
        """Start it (names carry the home's tag).

        Raises:
            ProbeError: a step failed (everything made so far is removed).
        """
        name = f"rba{tag}{secrets.token_hex(1)}"
        ports = (20000 + secrets.randbelow(20000), 40000 + secrets.randbelow(20000))
        replies = dict(zip(ports, (token("netns-allowed"), token("netns-other")), strict=True))
        try:
            srv = cls.start(name, f"{name}h", replies)
        except BackendError as exc:
            raise ProbeError(str(exc)) from None
        assert isinstance(srv, NetnsServer)
        return srv

    @property
    def ports(self) -> tuple[int, int]:
        """The allowed port, then the other one."""
        a, b = self.replies
        return a, b

    @property
    def tokens(self) -> tuple[str, str]:
        """What each port answers."""
        a, b = self.replies.values()
        return a, b

    def host_can_reach(self, port: int) -> str | None:
        """Connect from the host (sanity check that the server works); the token or None."""
        reply = self.connect_from(None, port, timeout=3)
        return None if not reply or reply.startswith("blocked") else reply


@dataclass
class AuditContext:
    """Everything the probes share during one audit."""

    home: Home
    backend: str
    baseline: str
    layer_dirs: list[Path]
    cycles: int = 1000
    sandboxes: list[AsyncSandbox] = field(default_factory=list)
    canary_dir: Path = Path()
    canary_file: Path = Path()
    canary_token: str = ""
    env_token: str = ""
    canary_proc: subprocess.Popen[bytes] | None = None
    loopback_port: int = 0
    loopback_token: str = ""
    abstract_name: str = ""
    abstract_token: str = ""
    netns: NetnsServer | None = None
    netns_error: str | None = None
    a: AsyncSandbox | None = None
    """Shared sandbox A: made with ``a_env_token`` in its env and ``a_secret_token`` secret."""
    b: AsyncSandbox | None = None
    """Shared sandbox B: plain."""
    a_env_token: str = ""
    a_secret_token: str = ""
    created_ids: set[str] = field(default_factory=set)
    """Every sandbox the audit created (the scope of its leak check)."""
    own_resources: list[str] = field(default_factory=list)
    """Host resources the audit itself made (netns, veth, canary dir), as paths to check."""
    _servers: list[Any] = field(default_factory=list)
    _abstract_sock: socket.socket | None = None
    capabilities: Any = None
    kernel: dict[str, Any] = field(default_factory=dict)
    """Whose kernel runs the sandbox: boot ids inside and on the host, and the verdict."""

    @property
    def shared_kernel(self) -> bool:
        """The sandbox runs on the host's kernel (namespace backend), so what its kernel
        accepts, the host's kernel accepted. Unknown counts as shared (the strict reading)."""
        return bool(self.kernel.get("shared", True))

    async def detect_kernel(self) -> None:
        """Compare the kernel inside sandbox A with the host's: boot id and ``/proc/version``
        (gVisor reports its own version; a VM has its own boot id)."""
        a, _ = await self.shared()
        files = ["/proc/sys/kernel/random/boot_id", "/proc/version"]
        host = {f: _read_text(Path(f)) for f in files}
        res = await a.exec(
            ["sh", "-c", 'for f in $0 $1; do echo "$(cat $f 2>/dev/null)"; done', *files]
        )
        inside = dict(zip(files, [*res.stdout.splitlines(), "", ""][:2], strict=True))
        same = [f for f in files if inside[f].strip() and inside[f].strip() == host[f].strip()]
        self.kernel = {
            "host": host,
            "sandbox": inside,
            # strict: when the sandbox shows nothing to compare, assume the host's kernel
            "shared": len(same) == len(files) or not any(v.strip() for v in inside.values()),
        }

    # ------------------------------------------------------------------ sandboxes

    async def shared(self) -> tuple[AsyncSandbox, AsyncSandbox]:
        """Sandboxes A and B (created on first use)."""
        if self.a is None or self.b is None:
            self.a_env_token = token("env-a")
            self.a_secret_token = token("secret-a")
            self.a = await self.sandbox(
                env={"RBX_AUDIT_ENV_A": self.a_env_token},
                secrets_={"RBX_AUDIT_SECRET_A": self.a_secret_token},
            )
            self.b = await self.sandbox()
        return self.a, self.b

    async def sandbox(
        self,
        *,
        limits: Limits | None = None,
        network: NetworkPolicy | str | None = None,
        env: dict[str, str] | None = None,
        secrets_: dict[str, str] | None = None,
    ) -> AsyncSandbox:
        """A new sandbox of the audited backend, destroyed by :meth:`close`."""
        sbx = await AsyncSandbox.create(
            self.baseline,
            backend=self.backend,
            limits=limits or Limits(memory_mb=256, disk_mb=256, pids=256),
            network=network,
            env=env,
            secrets=secrets_,
            labels={"rollbox-audit": "1"},
            home=self.home,
        )
        self.sandboxes.append(sbx)
        self.created_ids.add(sbx.id)
        return sbx

    async def py(
        self,
        sbx: AsyncSandbox,
        script: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = 60,
        user: str | None = None,
    ) -> dict[str, Any]:
        """Run a probe program (python3 source) inside and return the JSON it printed.

        Raises:
            ProbeError: it printed no result line (its output is in the message).
        """
        res = await sbx.exec(
            ["python3", "-c", script],
            stdin=json.dumps(args or {}),
            timeout=timeout,
            user=user,
        )
        for line in reversed(res.stdout.splitlines()):
            if line.startswith(MARK):
                out: dict[str, Any] = json.loads(line[len(MARK) :])
                out["_exit"] = res.exit_code
                return out
        raise ProbeError(
            f"probe program printed no result (exit {res.exit_code}): "
            f"{(res.stdout + res.stderr).strip()[-400:]}"
        )

    # ------------------------------------------------------------------ host canaries

    async def start_canaries(self) -> None:
        """Start the host-side canaries and the netns server (after removing what audits
        of this home that were killed left)."""
        await asyncio.to_thread(leftovers.sweep, self.home)
        name = f"rbx-audit-{self.home.tag}-{secrets.token_hex(4)}"
        self.canary_dir = leftovers.CANARY_ROOT / name
        self.canary_dir.mkdir(parents=True, exist_ok=False)
        self.own_resources.append(str(self.canary_dir))
        self.canary_token = token("hostfile")
        self.canary_file = self.canary_dir / "host-secret.txt"
        self.canary_file.write_text(self.canary_token + "\n")
        self.env_token = token("hostenv")
        # it dies with the audit (pdeathsig), even when the audit is SIGKILLed
        pdeath = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        self.canary_proc = subprocess.Popen(
            [*pdeath, "sleep", "3600"],
            env={"PATH": "/usr/bin:/bin", "RBX_AUDIT_HOST_SECRET": self.env_token},
            start_new_session=True,
        )
        owner = {
            "canary_pid": self.canary_proc.pid,
            "canary_started": leftovers.start_time(self.canary_proc.pid),
        }
        leftovers.write_owner(self.canary_dir, **owner)
        self.loopback_token = token("loopback")
        lb_tok = self.loopback_token.encode() + b"\n"

        async def handle(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(lb_tok)
            with contextlib.suppress(OSError):
                await w.drain()
            w.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        self._servers.append(srv)
        self.loopback_port = srv.sockets[0].getsockname()[1]
        self.abstract_token = token("abstract")
        self.abstract_name = f"rbxaudit-{self.home.tag}-{secrets.token_hex(4)}"
        usock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        usock.bind("\0" + self.abstract_name)
        usock.listen(16)
        usock.setblocking(False)
        self._abstract_sock = usock
        ab_tok = self.abstract_token.encode() + b"\n"

        async def handle_unix(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(ab_tok)
            with contextlib.suppress(OSError):
                await w.drain()
            w.close()

        usrv = await asyncio.start_unix_server(handle_unix, sock=usock)
        self._servers.append(usrv)
        try:
            self.netns = await asyncio.to_thread(NetnsServer.for_audit, self.home.tag[:8])
            self.own_resources += [
                f"/run/netns/{self.netns.netns}",
                f"/sys/class/net/{self.netns.host_if}",
            ]
            leftovers.write_owner(
                self.canary_dir, **owner, netns=self.netns.netns, host_if=self.netns.host_if
            )
        except (ProbeError, OSError) as exc:
            self.netns_error = str(exc)

    def canary_alive(self) -> bool:
        """The host canary process still runs."""
        return self.canary_proc is not None and self.canary_proc.poll() is None

    async def close(self) -> None:
        """Destroy every sandbox, stop every canary (idempotent, never raises)."""
        for sbx in self.sandboxes:
            with contextlib.suppress(RollboxError, OSError):
                await asyncio.shield(sbx.destroy())
        self.sandboxes.clear()
        self.a = self.b = None
        for srv in self._servers:
            srv.close()
            with contextlib.suppress(Exception):
                await srv.wait_closed()
        self._servers.clear()
        if self._abstract_sock is not None:
            self._abstract_sock.close()
            self._abstract_sock = None
        if self.canary_proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.canary_proc.kill()
            self.canary_proc.wait()
            self.canary_proc = None
        if self.netns is not None:
            await asyncio.to_thread(self.netns.stop)
            self.netns = None
        if self.canary_dir != Path() and self.canary_dir.exists():
            shutil.rmtree(self.canary_dir, ignore_errors=True)
