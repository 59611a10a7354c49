"""Egress allow-list networking for sandboxes (``NetworkPolicy.mode == "allow"``).

Modes ``none`` and ``loopback`` need nothing from here: the runtime gives the sandbox a
fresh network namespace holding only ``lo``.

For ``allow`` a sandbox gets, all named after the home tag and a hash of its id:

* a network namespace ``rbx-<tag>-<h10>`` (``/run/netns/...``) with ``lo`` and ``eth0``;
* a veth pair: ``r<tag><h6>`` on the host, ``eth0`` inside, a /30 out of 100.64.0.0/10
  (shared address space, never routed on this host) picked free under a host-wide lock;
* an iptables chain ``RBX-<tag>-<h6>`` (filter table) jumped to from ``FORWARD``
  (both directions) and ``INPUT`` for that veth: established/related traffic passes, new
  connections only to the allowed ``host:port`` (tcp and udp), everything else -- the host
  itself included -- is dropped;
* a nat chain of the same name masquerading the sandbox's address towards the allowed
  destinations, so they answer a host address they can route back to.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from rollbox.errors import BackendError, InvalidInputError
from rollbox.models import NetworkPolicy

NETNS_DIR = Path("/run/netns")
POOL = ipaddress.ip_network("100.64.0.0/10")
_LOCK_PATH = Path("/run/rollbox-network.lock")
SANDBOX_IF = "eth0"


def _h(sandbox_id: str) -> str:
    return hashlib.sha256(sandbox_id.encode()).hexdigest()


def netns_name(home_tag: str, sandbox_id: str) -> str:
    """Name of the sandbox's network namespace."""
    return f"rbx-{home_tag}-{_h(sandbox_id)[:10]}"


def host_if_name(home_tag: str, sandbox_id: str) -> str:
    """Host-side veth name (15 chars, the kernel's limit)."""
    return f"r{home_tag}{_h(sandbox_id)[:6]}"


def chain_name(home_tag: str, sandbox_id: str) -> str:
    """iptables chain name (filter and nat)."""
    return f"RBX-{home_tag}-{_h(sandbox_id)[:6]}"


@dataclass
class NetSetup:
    """The host resources of one sandbox's allow-list network."""

    netns: str
    """Name under /run/netns."""
    netns_path: Path
    """``/run/netns/<name>``: join it with ``nsenter --net=`` or an OCI namespace path."""
    host_if: str
    """Host end of the veth pair."""
    sandbox_if: str
    """Sandbox end (inside the netns)."""
    host_ip: str
    """Address of the host end (the sandbox's default gateway)."""
    sandbox_ip: str
    """Address of the sandbox end."""
    chain: str
    """iptables chain name (filter and nat tables)."""

    @classmethod
    def for_sandbox(cls, home_tag: str, sandbox_id: str) -> NetSetup:
        """The names a sandbox's network has (addresses unknown), enough to tear it down."""
        ns = netns_name(home_tag, sandbox_id)
        return cls(
            netns=ns,
            netns_path=NETNS_DIR / ns,
            host_if=host_if_name(home_tag, sandbox_id),
            sandbox_if=SANDBOX_IF,
            host_ip="",
            sandbox_ip="",
            chain=chain_name(home_tag, sandbox_id),
        )

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form (for a sandbox's state record)."""
        d = asdict(self)
        d["netns_path"] = str(self.netns_path)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> NetSetup:
        """Inverse of :meth:`to_dict`."""
        return cls(
            netns=str(d["netns"]),
            netns_path=Path(str(d["netns_path"])),
            host_if=str(d["host_if"]),
            sandbox_if=str(d["sandbox_if"]),
            host_ip=str(d["host_ip"]),
            sandbox_ip=str(d["sandbox_ip"]),
            chain=str(d["chain"]),
        )


def _run(args: list[str], *, check: bool = True, stdin: str | None = None) -> str:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise BackendError(f"{' '.join(args[:4])}... failed: {proc.stderr.strip()}")
    return proc.stdout


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of every address and route on the host (namespaces of the host)."""
    out = []
    for args in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        for line in _run(args, check=False).splitlines():
            for tok in line.split():
                if tok[0].isdigit() and ("/" in tok or tok.count(".") == 3):
                    try:
                        net = ipaddress.ip_network(tok, strict=False)
                    except ValueError:
                        continue
                    if isinstance(net, ipaddress.IPv4Network):
                        out.append(net)
    return out


def _pick_subnet(sandbox_id: str) -> ipaddress.IPv4Network:
    """A free /30 of :data:`POOL`, starting at a hash of the id (callers hold the lock)."""
    used = _used_networks()
    count = POOL.num_addresses // 4
    start = int(_h(sandbox_id)[:8], 16) % count
    for i in range(4096):
        idx = (start + i) % count
        net = ipaddress.ip_network((int(POOL.network_address) + idx * 4, 30))
        assert isinstance(net, ipaddress.IPv4Network)
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise BackendError("no free /30 left in 100.64.0.0/10 for a sandbox network")


def _check_policy(policy: NetworkPolicy) -> None:
    for hp in policy.allow:
        try:
            addr = ipaddress.ip_address(hp.host)
        except ValueError:
            raise InvalidInputError(
                f"network allow entry {hp} is not an IPv4 address",
                hint="give HOST as a numeric IPv4 address",
            ) from None
        if not isinstance(addr, ipaddress.IPv4Address):
            raise InvalidInputError(f"network allow entry {hp}: only IPv4 is supported")


def _filter_rules(net: NetSetup, policy: NetworkPolicy) -> str:
    c = net.chain
    lines = [
        "*filter",
        f":{c} - [0:0]",
        f"-A {c} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ]
    for hp in policy.allow:
        for proto in ("tcp", "udp"):
            lines.append(
                f"-A {c} -i {net.host_if} -d {hp.host}/32 -p {proto} -m {proto} "
                f"--dport {hp.port} -m conntrack --ctstate NEW -j ACCEPT"
            )
    lines += [
        f"-A {c} -j DROP",
        f"-I FORWARD 1 -i {net.host_if} -j {c}",
        f"-I FORWARD 1 -o {net.host_if} -j {c}",
        f"-I INPUT 1 -i {net.host_if} -j {c}",
        "COMMIT",
    ]
    return "\n".join(lines) + "\n"


def _nat_rules(net: NetSetup, policy: NetworkPolicy) -> str:
    c = net.chain
    lines = ["*nat", f":{c} - [0:0]"]
    for hp in policy.allow:
        lines.append(f"-A {c} -d {hp.host}/32 -j MASQUERADE")
    lines += [f"-I POSTROUTING 1 -s {net.sandbox_ip}/32 -j {c}", "COMMIT"]
    return "\n".join(lines) + "\n"


def setup_network(home_tag: str, sandbox_id: str, policy: NetworkPolicy) -> NetSetup:
    """Create the netns, veth pair, routes and firewall rules of an ``allow`` sandbox.

    Raises:
        InvalidInputError: an allow entry is not an IPv4 address.
        BackendError: a step failed (everything made so far is removed again).
    """
    _check_policy(policy)
    net = NetSetup.for_sandbox(home_tag, sandbox_id)
    try:
        NETNS_DIR.mkdir(parents=True, exist_ok=True)
        with open(_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _pick_subnet(sandbox_id)
            hosts = list(subnet.hosts())
            net.host_ip, net.sandbox_ip = str(hosts[0]), str(hosts[1])
            _run(["ip", "netns", "add", net.netns])
            veth = ["type", "veth", "peer", "name", net.sandbox_if, "netns", net.netns]
            _run(["ip", "link", "add", net.host_if, *veth])
            _run(["ip", "addr", "add", f"{net.host_ip}/30", "dev", net.host_if])
            _run(["ip", "link", "set", net.host_if, "up"])
        batch = "\n".join(
            [
                "link set lo up",
                f"addr add {net.sandbox_ip}/30 dev {net.sandbox_if}",
                f"link set {net.sandbox_if} up",
                f"route add default via {net.host_ip}",
            ]
        )
        _run(["ip", "-n", net.netns, "-batch", "-"], stdin=batch + "\n")
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        _run(["iptables-restore", "-w", "--noflush"], stdin=_filter_rules(net, policy))
        _run(["iptables-restore", "-w", "--noflush"], stdin=_nat_rules(net, policy))
    except BaseException:
        teardown_network(net)
        raise
    return net


def _delete_chain(table: str, chain: str) -> None:
    """Remove every rule jumping to ``chain`` in ``table``, then the chain itself."""
    listing = _run(["iptables", "-w", "-t", table, "-S"], check=False)
    deletes = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "-A" and parts[1] != chain and parts[-1] == chain:
            deletes.append("-D" + line[2:])
    exists = f"-N {chain}" in listing.splitlines()
    if not deletes and not exists:
        return
    batch = [f"*{table}", *deletes]
    if exists:
        batch += [f"-F {chain}", f"-X {chain}"]
    batch.append("COMMIT")
    proc = subprocess.run(
        ["iptables-restore", "-w", "--noflush"],
        input="\n".join(batch) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        # Someone else changed the table meanwhile: go rule by rule, ignoring misses.
        for d in deletes:
            _run(["iptables", "-w", "-t", table, *d.split()], check=False)
        _run(["iptables", "-w", "-t", table, "-F", chain], check=False)
        _run(["iptables", "-w", "-t", table, "-X", chain], check=False)


def teardown_network(net: NetSetup) -> None:
    """Remove the firewall chains, the veth pair and the netns (idempotent)."""
    for table in ("filter", "nat"):
        _delete_chain(table, net.chain)
    if Path("/sys/class/net", net.host_if).exists():
        _run(["ip", "link", "del", net.host_if], check=False)
    if net.netns_path.exists() or (NETNS_DIR / net.netns).exists():
        _run(["ip", "netns", "del", net.netns], check=False)
        # `ip netns del` leaves the file when the namespace is still mounted elsewhere.
        if (NETNS_DIR / net.netns).exists():
            subprocess.run(["umount", "-l", str(NETNS_DIR / net.netns)], capture_output=True)
            try:
                os.unlink(NETNS_DIR / net.netns)
            except FileNotFoundError:
                pass


def _home_resources(home_tag: str) -> tuple[set[str], set[str], set[str]]:
    """(netns names, host veth names, chain names) of this home on the host."""
    try:
        netns = {n for n in os.listdir(NETNS_DIR) if n.startswith(f"rbx-{home_tag}-")}
    except FileNotFoundError:
        netns = set()
    links = {
        n for n in os.listdir("/sys/class/net") if n.startswith(f"r{home_tag}") and len(n) == 15
    }
    chains = set()
    for table in ("filter", "nat"):
        for line in _run(["iptables", "-w", "-t", table, "-S"], check=False).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "-N" and parts[1].startswith(f"RBX-{home_tag}-"):
                chains.add(parts[1])
    return netns, links, chains


def orphan_networks(home_tag: str, live_ids: set[str]) -> list[str]:
    """Network resources of this home that belong to no live sandbox, as ``kind name``."""
    live = [NetSetup.for_sandbox(home_tag, i) for i in live_ids]
    netns, links, chains = _home_resources(home_tag)
    out = [f"netns {n}" for n in sorted(netns - {x.netns for x in live})]
    out += [f"veth {n}" for n in sorted(links - {x.host_if for x in live})]
    out += [f"iptables-chain {n}" for n in sorted(chains - {x.chain for x in live})]
    return out


def remove_orphan_networks(home_tag: str, live_ids: set[str], dry_run: bool) -> list[str]:
    """Remove (unless ``dry_run``) this home's orphan network resources; one line each."""
    found = orphan_networks(home_tag, live_ids)
    if dry_run:
        return found
    for item in found:
        kind, _, name = item.partition(" ")
        if kind == "netns":
            _run(["ip", "netns", "del", name], check=False)
        elif kind == "veth":
            _run(["ip", "link", "del", name], check=False)
        else:
            for table in ("filter", "nat"):
                _delete_chain(table, name)
    return found
