"""``allow=HOST:PORT`` for the namespace backend: only the allowed destination answers.

The destination is a server this test starts in a network namespace it made itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from rollbox.backends.common.testnet import CLIENT, netns_server
from rollbox.backends.conformance import Harness, scoped_diff
from rollbox.backends.namespace import NamespaceBackend
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, HostPort, NetworkPolicy

pytestmark = pytest.mark.root


@pytest.fixture
def server(sbx_home: Home) -> Iterator[str]:
    """TCP servers on 18180 and 18181 in a netns of this test; yields their address."""
    with netns_server(f"rbxn-{sbx_home.tag}", f"n{sbx_home.tag}srv", [18180, 18181]) as srv:
        yield srv.server_ip


def test_allow_list(sbx_home: Home, dev_baseline: BaselineInfo, server: str) -> None:
    async def go() -> None:
        be = NamespaceBackend(sbx_home)
        t = Harness(be, dev_baseline)
        before = HostState.capture(sbx_home.sandboxes)
        try:
            policy = NetworkPolicy(mode="allow", allow=[HostPort(host=server, port=18180)])
            h = await t.create(network=policy)

            async def connect(host: str, port: int) -> str:
                r = await h.exec(["python3", "-c", CLIENT, host, str(port), "1"], timeout=30)
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
