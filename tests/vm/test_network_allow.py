"""``allow=HOST:PORT`` on microVMs: the VM's NIC is a tap device in a sandbox netns that is
routed out through the same veth and host firewall rules a namespace sandbox gets. The
destination is a server this test starts in a network namespace it made itself."""

from __future__ import annotations

import asyncio
import socket

import pytest

from rollbox.backends.common.testnet import CLIENT, netns_server
from rollbox.backends.conformance import scoped_diff
from rollbox.backends.microvm import MicroVMBackend, MicroVMSandbox
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, HostPort, Limits, NetworkPolicy, SandboxSpec

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.root]


def test_allow_list_holds_in_a_vm_and_its_branches(
    vm_backend: MicroVMBackend, vm_home: Home, vm_baseline: BaselineInfo
) -> None:
    be = vm_backend
    before = HostState.capture(vm_home.sandboxes)
    tag = vm_home.tag
    with netns_server(f"rbxv-{tag}", f"v{tag}srv", [18380, 18381]) as srv, socket.socket() as lsn:
        lsn.bind(("127.0.0.1", 0))
        lsn.listen(1)
        loop_port = lsn.getsockname()[1]

        async def reach(h: MicroVMSandbox, host: str, port: int) -> str:
            r = await h.exec(["python3", "-c", CLIENT, host, str(port), "2"], timeout=60)
            return r.stdout.strip()

        async def go() -> None:
            policy = NetworkPolicy(mode="allow", allow=[HostPort(host=srv.server_ip, port=18380)])
            spec = SandboxSpec(
                baseline=vm_baseline.digest, backend="microvm", network=policy,
                limits=Limits(memory_mb=96),
            )  # fmt: skip
            h = await be.create(spec, vm_baseline)
            assert isinstance(h, MicroVMSandbox)
            branches: list[MicroVMSandbox] = []
            try:
                ifaces = (await h.exec("ls /sys/class/net")).stdout.split()
                assert sorted(ifaces) == ["eth0", "lo"]
                assert await reach(h, srv.server_ip, 18380) == "hello 18380"
                assert (await reach(h, srv.server_ip, 18381)).startswith("blocked")
                assert (await reach(h, "127.0.0.1", loop_port)).startswith("blocked")
                net = h.info.extra["net"]
                assert isinstance(net, dict)
                # neither the netns's veth end nor the host end answers
                for addr in (str(net["sandbox_ip"]), str(net["host_ip"])):
                    assert (await reach(h, addr, loop_port)).startswith("blocked")
                # a branch restored from its memory snapshot gets its own netns, same rules
                branches = [b for b in await h.fork(1) if isinstance(b, MicroVMSandbox)]
                b = branches[0]
                assert b.info.extra["net"] != net
                assert await reach(b, srv.server_ip, 18380) == "hello 18380"
                assert (await reach(b, srv.server_ip, 18381)).startswith("blocked")
            finally:
                for x in [*branches, h]:
                    await x.destroy()

        asyncio.run(go())
    leaks = scoped_diff(before, HostState.capture(vm_home.sandboxes), vm_home)
    assert not leaks, leaks
