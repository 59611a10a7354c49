"""TCP test servers inside network namespaces made for the purpose (conformance, audit,
tests): the only non-loopback peers rollbox's own checks ever talk to.

Each server lives in a fresh network namespace joined to the host by a veth pair on a /30
(by default a random one of 198.18.0.0/15, the benchmarking range, routed nowhere), and
answers every connection on each of its ports with a fixed reply, then closes it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from rollbox.errors import BackendError

SERVER = r"""
import socket, sys, threading
def serve(port, reply):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, _ = s.accept()
        try: c.sendall(reply.encode())
        finally: c.close()
for arg in sys.argv[1:]:
    port, _, reply = arg.partition("=")
    threading.Thread(target=serve, args=(int(port), reply), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

CLIENT = r"""
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print(c.recv(256).decode().strip())
except OSError as e:
    print("blocked", type(e).__name__)
"""
"""``python3 -c CLIENT HOST PORT TIMEOUT``: prints the server's reply, or ``blocked <error>``."""


def connect(netns: str | None, host: str, port: int, timeout: float = 2.0) -> str:
    """Connect to ``host:port`` from network namespace ``netns`` (None: the host's); the
    first reply line, or ``blocked <error>``."""
    argv = [sys.executable, "-c", CLIENT, host, str(port), str(timeout)]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 20, check=False)
    return out.stdout.strip()


def random_subnet() -> ipaddress.IPv4Network:
    """A random /30 of 198.18.0.0/15."""
    block = int.from_bytes(os.urandom(2), "big") % (1 << 15)
    net = ipaddress.ip_network(((198 << 24) | (18 << 16) | (block << 2), 30))
    assert isinstance(net, ipaddress.IPv4Network)
    return net


@dataclass
class NetnsServer:
    """A running server: its namespace, the host end of the veth pair and the addresses."""

    netns: str
    host_if: str
    host_ip: str
    server_ip: str
    replies: dict[int, str]
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        netns: str,
        host_if: str,
        replies: Mapping[int, str],
        *,
        subnet: ipaddress.IPv4Network | None = None,
    ) -> NetnsServer:
        """Make the namespace, the veth pair (host end ``host_if``, at most 15 characters)
        and the server answering ``replies[port]`` on each port.

        Raises:
            BackendError: a step failed (everything made so far is removed).
        """
        gw, ip = (str(h) for h in (subnet or random_subnet()).hosts())
        srv = cls(netns, host_if, gw, ip, dict(replies))
        steps = [
            ["ip", "netns", "add", netns],
            ["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns],
            ["ip", "addr", "add", f"{gw}/30", "dev", host_if],
            ["ip", "link", "set", host_if, "up"],
            ["ip", "-n", netns, "addr", "add", f"{ip}/30", "dev", "eth0"],
            ["ip", "-n", netns, "link", "set", "eth0", "up"],
            ["ip", "-n", netns, "link", "set", "lo", "up"],
            ["ip", "-n", netns, "route", "add", "default", "via", gw],
        ]
        try:
            for argv in steps:
                r = subprocess.run(argv, capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    raise BackendError(f"{' '.join(argv)}: {r.stderr.strip()}")
            args = [f"{port}={reply}" for port, reply in srv.replies.items()]
            srv.proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, "-c", SERVER, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            assert srv.proc.stdout is not None
            if srv.proc.stdout.readline().strip() != b"ready":
                raise BackendError("the test server in the network namespace did not start")
        except BaseException:
            srv.stop()
            raise
        return srv

    def connect_from(self, netns: str | None, port: int, timeout: float = 2.0) -> str:
        """Connect to the server from ``netns`` (None: the host); the reply or ``blocked …``."""
        return connect(netns, self.server_ip, port, timeout)

    def stop(self) -> None:
        """Kill the server and remove the veth pair and the namespace."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)


@contextlib.contextmanager
def netns_server(
    netns: str,
    host_if: str,
    ports: Mapping[int, str] | list[int],
    *,
    subnet: ipaddress.IPv4Network | None = None,
) -> Iterator[NetnsServer]:
    """:meth:`NetnsServer.start` for a block; ``ports`` as a list answers ``hello PORT``."""
    replies = ports if isinstance(ports, Mapping) else {p: f"hello {p}" for p in ports}
    srv = NetnsServer.start(netns, host_if, replies, subnet=subnet)
    try:
        yield srv
    finally:
        srv.stop()
