"""Network probes: no route out, no host loopback, allow-list honoured, no rollbox socket.

Every address used is on this machine: 127.0.0.1 (a service the audit starts) and the
addresses of a network namespace the audit made itself (198.18.0.0/15).
"""

from __future__ import annotations

from rollbox.audit import scripts
from rollbox.audit.context import AuditContext, ProbeError
from rollbox.audit.registry import Outcome, probe, verdict


def _connected(results: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in results.items() if v.startswith("CONNECTED")}


@probe("network-none-no-route", "network")
async def no_route(ctx: AuditContext) -> Outcome:
    """With network ``none`` only loopback exists inside and nothing outside is reachable."""
    a, _ = await ctx.shared()
    targets = []
    if ctx.netns is not None:
        targets += [
            [ctx.netns.server_ip, ctx.netns.ports[0]],
            [ctx.netns.host_ip, ctx.loopback_port],
        ]
    res = await ctx.py(a, scripts.NETWORK_NONE, {"targets": targets})
    non_lo = [i for i in res["interfaces"] if i != "lo"]
    conn = _connected(res["connect"])
    breaches = []
    if non_lo:
        breaches.append(f"interfaces besides lo: {non_lo}")
    if res["routes"]:
        breaches.append(f"routes inside: {res['routes']}")
    if conn:
        breaches.append(f"reached: {conn}")
    out = verdict(
        breaches,
        f"interfaces {res['interfaces']}, no IPv4 route; connects to the audit's netns server: "
        f"{res['connect'] or 'skipped (no netns server: ' + str(ctx.netns_error) + ')'}",
    )
    out.evidence = res
    return out


@probe("host-loopback-service", "network")
async def host_loopback(ctx: AuditContext) -> Outcome:
    """A service on the host's 127.0.0.1 is unreachable from inside."""
    a, _ = await ctx.shared()
    res = await ctx.py(a, scripts.CONNECT, {"tcp": [["127.0.0.1", ctx.loopback_port]]})
    got = [v for v in res["connect"].values() if ctx.loopback_token in v]
    out = verdict(
        [f"host loopback service reached: {got}"] if got else [],
        f"127.0.0.1:{ctx.loopback_port} from inside: {next(iter(res['connect'].values()))}",
    )
    out.evidence = {"port": ctx.loopback_port, **res}
    return out


@probe("netns-server-allowlist", "network")
async def netns_allowlist(ctx: AuditContext) -> Outcome:
    """The audit's own netns server: unreachable with ``none``, reachable only on the
    allow-listed port with ``allow``."""
    if ctx.netns is None:
        raise ProbeError(f"could not set up the audit's network namespace: {ctx.netns_error}")
    ns = ctx.netns
    if ns.host_can_reach(ns.ports[0]) != ns.tokens[0]:
        raise ProbeError("the audit's netns server does not answer the host")
    a, _ = await ctx.shared()
    both = [[ns.server_ip, ns.ports[0]], [ns.server_ip, ns.ports[1]]]
    none_res = (await ctx.py(a, scripts.CONNECT, {"tcp": both}))["connect"]
    breaches = []
    if _connected(none_res):
        breaches.append(f"reached with network none: {_connected(none_res)}")
    evidence: dict[str, object] = {"none": none_res, "server": f"{ns.server_ip} ports {ns.ports}"}
    caps = ctx.capabilities
    if caps is None or "allow" not in caps.network_modes:
        out = verdict(breaches, f"none: {none_res}; backend has no allow mode")
        out.evidence = evidence
        return out
    allowed = f"allow={ns.server_ip}:{ns.ports[0]}"
    n = await ctx.sandbox(network=allowed)
    targets = [*both, ["127.0.0.1", ctx.loopback_port], [ns.host_ip, ctx.loopback_port]]
    allow_res = (await ctx.py(n, scripts.CONNECT, {"tcp": targets}))["connect"]
    evidence["allow"] = allow_res
    ok_key = f"{ns.server_ip}:{ns.ports[0]}"
    others = {k: v for k, v in _connected(allow_res).items() if k != ok_key}
    if others:
        breaches.append(f"reached beyond the allow-list: {others}")
    reached = ns.tokens[0] in allow_res.get(ok_key, "")
    if not breaches and not reached:
        out = Outcome("error", f"allow-listed {ok_key} unreachable: {allow_res[ok_key]}", {})
    else:
        out = verdict(
            breaches,
            f"none: nothing reached; {allowed}: {ok_key} reached, port {ns.ports[1]} and host "
            "loopback refused",
        )
    out.evidence = evidence
    return out


@probe("rollbox-home-and-sockets", "network")
async def home_and_sockets(ctx: AuditContext) -> Outcome:
    """ROLLBOX_HOME, the store and rollbox's sockets are unreachable from inside."""
    a, _ = await ctx.shared()
    paths = [
        str(ctx.home.root),
        str(ctx.home.db_path),
        str(ctx.home.sandboxes),
        str(ctx.home.oci),
        str(ctx.home.blobs),
        str(ctx.home.locks),
        "/var/lib/rollbox",
    ]
    res = await ctx.py(a, scripts.SOCKETS, {"paths": paths})
    conn = await ctx.py(a, scripts.CONNECT, {"abstract": [ctx.abstract_name]})
    breaches = []
    visible = [p for p, e in res["exists"].items() if e]
    if visible:
        breaches.append(f"home paths visible: {visible}")
    socks = _connected(res["sockets"])
    if socks:
        breaches.append(f"unix sockets accept connections inside: {socks}")
    if _connected(conn["connect"]):
        breaches.append("host abstract unix socket reached")
    home_socks = [p for p in res["proc_net_unix_paths"] if str(ctx.home.root) in p]
    if home_socks:
        breaches.append(f"home sockets listed in /proc/net/unix: {home_socks}")
    evidence: dict[str, object] = {"root": res, "abstract": conn["connect"]}
    caps = ctx.capabilities
    if caps is not None and caps.users:
        nobody = await ctx.py(a, scripts.SOCKETS, {"paths": paths}, user="65534")
        evidence["uid_65534"] = nobody
        if _connected(nobody["sockets"]):
            breaches.append(f"uid 65534 connects to sockets: {_connected(nobody['sockets'])}")
    out = verdict(
        breaches,
        f"{len(paths)} home paths absent, {len(res['sockets'])} unix socket files inside, none "
        "accepts; host abstract socket refused",
    )
    out.evidence = evidence
    return out
