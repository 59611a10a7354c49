"""Unit tests of the pure parts of backends/common (names, rules, limit checks)."""

from __future__ import annotations

import os

import pytest

from rollbox.backends.common import network
from rollbox.backends.common.cgroups import cgroup_name, check_limits
from rollbox.backends.common.network import NetSetup, chain_name, host_if_name, netns_name
from rollbox.errors import InvalidInputError, LimitsError
from rollbox.models import HostPort, Limits, NetworkPolicy


def test_names_carry_home_tag_and_fit_kernel_limits() -> None:
    sid = "sbx-01jabcdefghjkmnpqrstvwxyz0"
    assert cgroup_name("deadbeef", sid) == f"rollbox-deadbeef/{sid}"
    ifname = host_if_name("deadbeef", sid)
    assert ifname.startswith("rdeadbeef") and len(ifname) == 15  # IFNAMSIZ - 1
    assert netns_name("deadbeef", sid).startswith("rbx-deadbeef-")
    chain = chain_name("deadbeef", sid)
    assert chain.startswith("RBX-deadbeef-") and len(chain) <= 28
    # Deterministic (teardown from another process) and distinct per sandbox.
    assert host_if_name("deadbeef", sid) == ifname
    assert host_if_name("deadbeef", sid + "x") != ifname


def test_netsetup_roundtrip() -> None:
    net = NetSetup.for_sandbox("deadbeef", "sbx-1")
    net.host_ip, net.sandbox_ip = "100.64.0.1", "100.64.0.2"
    assert NetSetup.from_dict(dict(net.to_dict())) == net


def test_filter_rules_admit_only_allowed_destinations() -> None:
    net = NetSetup.for_sandbox("deadbeef", "sbx-1")
    net.sandbox_ip = "100.64.0.2"
    policy = NetworkPolicy(mode="allow", allow=[HostPort(host="10.1.2.3", port=8080)])
    rules = network._filter_rules(net, policy)
    accepts = [r for r in rules.splitlines() if r.endswith("-j ACCEPT")]
    assert any("ESTABLISHED" in r for r in accepts)
    new_accepts = [r for r in accepts if "--ctstate NEW" in r]
    assert len(new_accepts) == 2  # tcp and udp
    assert all("-d 10.1.2.3/32" in r and "--dport 8080" in r for r in new_accepts)
    chain_rules = [r for r in rules.splitlines() if r.startswith(f"-A {net.chain}")]
    assert chain_rules[-1] == f"-A {net.chain} -j DROP"
    jumps = [r for r in rules.splitlines() if r.startswith("-I ")]
    assert {r.split()[1] for r in jumps} == {"FORWARD", "INPUT"}


def test_policy_rejects_hostnames() -> None:
    with pytest.raises(InvalidInputError, match="not an IPv4 address"):
        network._check_policy(
            NetworkPolicy(mode="allow", allow=[HostPort(host="example.org", port=80)])
        )


def test_limits_that_cannot_be_met() -> None:
    with pytest.raises(LimitsError, match="cpus"):
        check_limits(Limits(cpus=(os.cpu_count() or 1) + 1))
    with pytest.raises(LimitsError, match="memory_mb"):
        check_limits(Limits(memory_mb=10_000_000))
    with pytest.raises(LimitsError, match="too small"):
        check_limits(Limits(memory_mb=1))
    check_limits(Limits())  # defaults fit
