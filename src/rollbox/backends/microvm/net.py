"""Networking of an ``allow`` microVM: a tap device in the sandbox's netns, routed out of it.

Why here and not in ``backends/common/``: the tap device, the router address the guest's init
configures (:mod:`.initramfs`) and the fixed router MAC a restored VM's ARP cache expects are
QEMU-only. Everything a namespace sandbox has too (netns, veth pair, the host's allow-list
firewall rules) is built by :mod:`rollbox.backends.common.network`, which this module calls and
which so stays free of microVM imports.
"""

from __future__ import annotations

import subprocess

from rollbox.config import Home
from rollbox.errors import (
    BackendError,
)
from rollbox.models import (
    SandboxInfo,
    SandboxSpec,
)

ROUTER_MAC = "02:72:62:78:00:01"  # locally administered


def setup_vm_network(home: Home, sandbox_id: str, spec: SandboxSpec) -> dict[str, str]:
    """For an ``allow`` sandbox: the same netns, veth pair and host firewall rules as a
    ``namespace`` sandbox gets, plus a tap device in that netns for QEMU's NIC, routed and
    masqueraded out of the netns's veth — so the host's allow-list rules see the VM's
    traffic exactly as a namespace sandbox's. Returns the setup (``NetSetup.to_dict``).

    Raises:
        InvalidInputError: an allow entry is not an IPv4 address.
        BackendError: a step failed (everything made so far is removed).
    """
    from rollbox.backends.common import network as netmod
    from rollbox.backends.microvm.initramfs import GUEST_IP, ROUTER_IP

    net = netmod.setup_network(home.tag, sandbox_id, spec.network)
    inside = ["nsenter", f"--net=/run/netns/{net.netns}"]
    tap = "\n".join(
        [
            "tuntap add dev tap0 mode tap",
            # one fixed router MAC: a VM restored from a snapshot keeps its ARP cache
            f"link set tap0 address {ROUTER_MAC}",
            f"addr add {ROUTER_IP}/30 dev tap0",
            "link set tap0 up",
        ]
    )
    steps: list[tuple[list[str], str | None]] = [
        (["ip", "-n", net.netns, "-batch", "-"], tap + "\n"),
        ([*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1"], None),
        ([*inside, "iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", f"{GUEST_IP}/32",
          "-o", net.sandbox_if, "-j", "MASQUERADE"], None),
    ]  # fmt: skip
    try:
        for argv, stdin in steps:
            r = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise BackendError(f"microvm network: {' '.join(argv)}: {r.stderr.strip()}")
    except BaseException:
        netmod.teardown_network(net)
        raise
    return net.to_dict()


def teardown_vm_network(info: SandboxInfo) -> bool:
    net = info.extra.get("net")
    if not isinstance(net, dict):
        return False
    from rollbox.backends.common import network as netmod

    netmod.teardown_network(netmod.NetSetup.from_dict(net))
    return True
