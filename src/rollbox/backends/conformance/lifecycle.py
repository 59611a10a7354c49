"""Conformance checks of the sandbox lifecycle: no network, no leftovers, pause/resume,
snapshot and fork."""

from __future__ import annotations

import socket
import uuid

from rollbox.backends.common.testnet import CLIENT, netns_server
from rollbox.backends.conformance.harness import Harness, check, scoped_diff, sh
from rollbox.errors import (
    SandboxStateError,
)
from rollbox.hoststate import HostState


async def network_none(t: Harness) -> None:
    """With network ``none`` only ``lo`` exists, there is no route, and neither a server in
    a network namespace made by this check (reachable from the host) nor a server on the
    host's own loopback is reachable from inside."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        h = await t.create()
        ifaces = (await sh(h, "tail -n +3 /proc/net/dev | cut -d: -f1")).split()
        check([i.strip() for i in ifaces] == ["lo"], f"interfaces inside: {ifaces}")
        routes = (await sh(h, "tail -n +2 /proc/net/route")).strip()
        check(routes == "", f"routes inside: {routes}")
        r = await h.exec(["python3", "-c", CLIENT, "127.0.0.1", str(port), "2"], timeout=20)
        check(r.stdout.startswith("blocked"), f"host loopback reachable: {r.stdout}")
        tag = uuid.uuid4().hex[:8]
        with netns_server(f"rbxc-{tag}", f"c{tag}", [18280]) as server:
            host = server.connect_from(None, 18280)
            check(host == "hello 18280", f"test server unreachable from host: {host}")
            r = await h.exec(["python3", "-c", CLIENT, server.server_ip, "18280", "2"], timeout=20)
            check(r.stdout.startswith("blocked"), f"server reachable from inside: {r.stdout}")
    finally:
        srv.close()


async def no_leftovers(t: Harness) -> None:
    """After destroy the host has no mount, cgroup, netns, veth, chain, process or dir left."""
    before = HostState.capture(t.home.sandboxes)
    h = await t.create()
    await sh(h, "setsid sleep 300 >/dev/null 2>&1 & echo x > /tmp/x")
    await h.destroy()
    await h.destroy()  # idempotent
    t.made.remove(h)
    after = HostState.capture(t.home.sandboxes)
    leaks = scoped_diff(before, after, t.home)
    check(not leaks, f"leftovers after destroy: {leaks}")
    try:
        await h.exec(["true"])
    except SandboxStateError:
        pass
    else:
        raise AssertionError("exec on a destroyed sandbox did not fail")


async def pause_resume(t: Harness) -> None:
    """A paused sandbox runs nothing and refuses exec until resumed."""
    h = await t.create()
    await h.pause()
    try:
        await h.exec(["true"])
    except SandboxStateError:
        pass
    else:
        raise AssertionError("exec on a paused sandbox did not fail")
    await h.resume()
    check((await h.exec(["true"])).exit_code == 0, "exec after resume failed")
    await sh(h, "sleep 300 >/dev/null 2>&1 &")
    await h.pause()
    before = HostState.capture(t.home.sandboxes)
    await h.destroy()  # a paused sandbox must be destroyable (frozen tasks die too)
    t.made.remove(h)
    after = HostState.capture(t.home.sandboxes)
    check(len(after.sandbox_dirs) < len(before.sandbox_dirs), "paused sandbox not removed")


async def snapshot_and_fork(t: Harness) -> None:
    """Snapshot and fork children see the parent's files, then diverge independently."""
    parent = await t.create()
    await sh(parent, "echo v1 > /root/state; rm -f /etc/issue")
    digest = await parent.snapshot(name=f"conformance/{uuid.uuid4().hex[:8]}")
    check(digest != t.baseline.digest, "snapshot returned the parent digest")
    from rollbox.baselines.store import BaselineStore

    snap = BaselineStore(t.home).resolve(digest)
    check(snap.parent == t.baseline.digest, "snapshot does not record its parent")
    child = await Harness(t.backend, snap).create()
    t.made.append(child)
    check(
        await sh(child, "cat /root/state; test ! -e /etc/issue && echo gone") == "v1\ngone\n",
        "snapshot child",
    )
    forks = t.track(await parent.fork(2))
    check(len(forks) == 2, "fork(2) did not give 2 sandboxes")
    for f in forks:
        check(await sh(f, "cat /root/state") == "v1\n", "fork does not see the parent's file")
    await sh(forks[0], "echo v2 > /root/state")
    check(await sh(forks[1], "cat /root/state") == "v1\n", "forks are not independent")
    check(await sh(parent, "cat /root/state") == "v1\n", "a fork changed its parent")
    await sh(parent, "echo v3 > /root/state")
    check(await sh(child, "cat /root/state") == "v1\n", "the parent changed its snapshot child")
