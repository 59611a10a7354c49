"""``allow=HOST:PORT`` for the namespace backend: only the allowed destination answers.

The destination is a server this test starts in a network namespace it made itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rollbox.backends.common import network
from rollbox.backends.conformance import Harness, scoped_diff
from rollbox.backends.namespace import NamespaceBackend
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, HostPort, NetworkPolicy

pytestmark = pytest.mark.root

SERVER = """
import socket, sys, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(8)
    while True:
        c, _ = s.accept(); c.sendall(b"hello %d" % port); c.close()
for p in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.0)
    print(c.recv(64).decode())
except OSError as e:
    print("blocked", type(e).__name__)
"""


@pytest.fixture
def server(sbx_home: Home) -> Iterator[str]:
    """TCP servers on 18180 and 18181 in a netns of this test; yields their address."""
    ns, host_if = f"rbxn-{sbx_home.tag}", f"n{sbx_home.tag}srv"
    subnet = network._pick_subnet(ns)
    gw, ip = (str(h) for h in subnet.hosts())
    cmds = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "addr", "add", f"{gw}/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", gw],
    ]
    proc = None
    try:
        for c in cmds:
            subprocess.run(c, check=True, capture_output=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, "18180", "18181"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield ip
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def test_allow_list(sbx_home: Home, dev_baseline: BaselineInfo, server: str) -> None:
    async def go() -> None:
        be = NamespaceBackend(sbx_home)
        t = Harness(be, dev_baseline)
        before = HostState.capture(sbx_home.sandboxes)
        try:
            policy = NetworkPolicy(mode="allow", allow=[HostPort(host=server, port=18180)])
            h = await t.create(network=policy)

            async def connect(host: str, port: int) -> str:
                r = await h.exec(["python3", "-c", CLIENT, host, str(port)], timeout=30)
                return r.stdout.strip()

            assert await connect(server, 18180) == "hello 18180"
            assert (await connect(server, 18181)).startswith("blocked")
            assert (await connect("127.0.0.1", 18180)).startswith("blocked")
            ifaces = (await h.exec("tail -n +3 /proc/net/dev | cut -d: -f1")).stdout.split()
            assert sorted(ifaces) == ["eth0", "lo"]
            await h.destroy()
            t.made.clear()
            assert scoped_diff(before, HostState.capture(sbx_home.sandboxes), sbx_home) == {}
        finally:
            await t.close()

    asyncio.run(go())
