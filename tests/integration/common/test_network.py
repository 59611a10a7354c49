"""Real netns/veth/iptables: an allow-listed host:port is reachable, nothing else (root).

The destination is a server this test starts in a network namespace it made itself.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from rollbox.backends.common import network
from rollbox.backends.common.network import (
    orphan_networks,
    remove_orphan_networks,
    setup_network,
    teardown_network,
)
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import HostPort, NetworkPolicy

LeakCheck = Callable[[HostState, HostState], dict[str, list[str]]]

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


def _connect(netns: str, host: str, port: int) -> str:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", CLIENT, host, str(port)],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return out.stdout.strip()


@pytest.fixture
def server(home: Home) -> Iterator[str]:
    """A TCP server on ports 18080 and 18081 in a netns of this test; yields its address."""
    ns, host_if = f"rbxt-{home.tag}", f"t{home.tag}srv"
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
            ["ip", "netns", "exec", ns, sys.executable, "-c", SERVER, "18080", "18081"],
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


def test_allow_list_admits_only_the_allowed_port(home: Home, server: str, leaks: LeakCheck) -> None:
    before = HostState.capture()
    policy = NetworkPolicy(mode="allow", allow=[HostPort(host=server, port=18080)])
    net = setup_network(home.tag, "sbx-nettest", policy)
    host_listener = socket.socket()
    try:
        host_listener.bind((net.host_ip, 18082))
        host_listener.listen(1)
        assert _connect(net.netns, server, 18080) == "hello 18080"
        assert _connect(net.netns, server, 18081).startswith("blocked")
        # The host itself (the sandbox's gateway) is not reachable either.
        assert _connect(net.netns, net.host_ip, 18082).startswith("blocked")
        assert orphan_networks(home.tag, {"sbx-nettest"}) == []
        assert len(orphan_networks(home.tag, set())) == 3
    finally:
        host_listener.close()
        teardown_network(net)
    teardown_network(net)  # idempotent
    assert orphan_networks(home.tag, set()) == []
    time.sleep(0.05)
    assert leaks(before, HostState.capture()) == {}


def test_remove_orphan_networks(home: Home) -> None:
    setup_network(home.tag, "sbx-orphan", NetworkPolicy(mode="allow", allow=[]))
    found = remove_orphan_networks(home.tag, set(), dry_run=True)
    assert sorted(x.split()[0] for x in found) == ["iptables-chain", "netns", "veth"]
    assert remove_orphan_networks(home.tag, set(), dry_run=False) == found
    assert orphan_networks(home.tag, set()) == []
