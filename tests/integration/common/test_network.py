"""Real netns/veth/iptables: an allow-listed host:port is reachable, nothing else (root).

The destination is a server this test starts in a network namespace it made itself.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from rollbox.backends.common.network import (
    orphan_networks,
    remove_orphan_networks,
    setup_network,
    teardown_network,
)
from rollbox.backends.common.testnet import connect, netns_server
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import HostPort, NetworkPolicy

LeakCheck = Callable[[HostState, HostState], dict[str, list[str]]]

pytestmark = pytest.mark.root


@pytest.fixture
def server(home: Home) -> Iterator[str]:
    """A TCP server on ports 18080 and 18081 in a netns of this test; yields its address."""
    with netns_server(f"rbxt-{home.tag}", f"t{home.tag}srv", [18080, 18081]) as srv:
        yield srv.server_ip


def test_allow_list_admits_only_the_allowed_port(home: Home, server: str, leaks: LeakCheck) -> None:
    before = HostState.capture()
    policy = NetworkPolicy(mode="allow", allow=[HostPort(host=server, port=18080)])
    net = setup_network(home.tag, "sbx-nettest", policy)
    host_listener = socket.socket()
    try:
        host_listener.bind((net.host_ip, 18082))
        host_listener.listen(1)
        assert connect(net.netns, server, 18080) == "hello 18080"
        assert connect(net.netns, server, 18081).startswith("blocked")
        # The host itself (the sandbox's gateway) is not reachable either.
        assert connect(net.netns, net.host_ip, 18082).startswith("blocked")
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
