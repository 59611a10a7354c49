"""What is specific to the gvisor backend (the shared behaviour is the conformance suite)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollbox.backends.common.testnet import CLIENT, netns_server
from rollbox.backends.gvisor import GVisorBackend
from rollbox.backends.gvisor.backend import runsc_root
from rollbox.config import Home
from rollbox.errors import CapabilityError, ExecTimeoutError
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, HostPort, Limits, NetworkPolicy, SandboxSpec

pytestmark = pytest.mark.root


def _mine(home: Home, before: HostState, after: HostState) -> dict[str, list[str]]:
    out = {}
    for kind, items in before.diff(after).items():
        mine = items if kind == "sandbox_dirs" else [x for x in items if home.tag in x]
        if mine:
            out[kind] = mine
    return out


def _spec(baseline: BaselineInfo, **kw: object) -> SandboxSpec:
    return SandboxSpec(baseline=baseline.digest, backend="gvisor", **kw)  # type: ignore[arg-type]


def test_runs_in_gvisor_writes_reach_the_host_upper(
    gvisor: GVisorBackend, gv_baseline: BaselineInfo, gv_home: Home
) -> None:
    async def go() -> None:
        h = await gvisor.create(_spec(gv_baseline), gv_baseline)
        try:
            # The kernel inside is gVisor's, not the host's.
            r = await h.exec("dmesg 2>/dev/null | head -1; cat /proc/version")
            assert "gVisor" in r.stdout or "Starting gVisor" in r.stdout, r
            r = await h.exec("echo in > /root/inside; echo t > /tmp/t; echo $((6*7))")
            assert r.stdout == "42\n"
            upper = gv_home.sandboxes / h.id / "upperfs" / "upper"
            assert (upper / "root/inside").read_text() == "in\n"
            assert (upper / "tmp/t").read_text() == "t\n"  # /tmp is the overlay's, too
            await h.write_file("/root/from-host", "hello")
            assert (await h.exec(["cat", "/root/from-host"])).stdout == "hello"
            # coreutils' statx flags work (through the LD_PRELOAD shim).
            r = await h.exec("ls /root; stat -c %s /root/from-host")
            assert r.stdout == "from-host\ninside\n5\n", r
        finally:
            await h.destroy()

    asyncio.run(go())


def test_timeout_kills_setsid_daemons_but_not_other_processes(
    gvisor: GVisorBackend, gv_baseline: BaselineInfo
) -> None:
    async def go() -> None:
        h = await gvisor.create(_spec(gv_baseline), gv_baseline)
        try:
            await h.exec("setsid sleep 401 >/dev/null 2>&1 &")  # an earlier, finished exec
            with pytest.raises(ExecTimeoutError):
                await h.exec("setsid sleep 402 & (sleep 403 &); sleep 404", timeout=1)
            r = await h.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
            assert "sleep 401" in r.stdout
            assert not any(f"sleep 40{i}" in r.stdout for i in (2, 3, 4)), r.stdout
        finally:
            await h.destroy()

    asyncio.run(go())


def test_memory_limit_oom_is_reported(gvisor: GVisorBackend, gv_baseline: BaselineInfo) -> None:
    async def go() -> None:
        h = await gvisor.create(_spec(gv_baseline, limits=Limits(memory_mb=64)), gv_baseline)
        try:
            r = await h.exec(["python3", "-c", "a = bytearray(600 << 20)"], timeout=60)
            assert r.oom_killed and r.exit_code == 137, r
            assert h.info.state == "crashed"
        finally:
            await h.destroy()

    asyncio.run(go())


def test_memory_snapshot_refused(gvisor: GVisorBackend, gv_baseline: BaselineInfo) -> None:
    with pytest.raises(CapabilityError, match="memory snapshots"):
        gvisor.check(_spec(gv_baseline, from_snapshot="x"))
    assert not gvisor.capabilities.memory_snapshot


def test_allow_list_network(
    gvisor: GVisorBackend, gv_baseline: BaselineInfo, gv_home: Home
) -> None:
    """A server in a netns this test made: the allowed port answers, another does not."""
    before = HostState.capture(gv_home.sandboxes)
    with netns_server(f"rbxt-{gv_home.tag}", f"t{gv_home.tag}srv", [18090, 18091]) as srv:
        ip = srv.server_ip

        async def go() -> None:
            policy = NetworkPolicy(mode="allow", allow=[HostPort(host=ip, port=18090)])
            h = await gvisor.create(_spec(gv_baseline, network=policy), gv_baseline)
            try:
                r = await h.exec(["python3", "-c", CLIENT, ip, "18090", "2"], timeout=30)
                assert r.stdout.strip() == "hello 18090", r
                r = await h.exec(["python3", "-c", CLIENT, ip, "18091", "2"], timeout=30)
                assert r.stdout.startswith("blocked"), r
                # Nor is the host itself (the sandbox's gateway), even with a listener there.
                net = h.info.extra["net"]
                assert isinstance(net, dict)
                with socket.socket() as lsn:
                    lsn.bind((str(net["host_ip"]), 18092))
                    lsn.listen(1)
                    r = await h.exec(
                        ["python3", "-c", CLIENT, str(net["host_ip"]), "18092", "2"], timeout=30
                    )
                    assert r.stdout.startswith("blocked"), r
            finally:
                await h.destroy()

        asyncio.run(go())
    assert _mine(gv_home, before, HostState.capture(gv_home.sandboxes)) == {}


OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from rollbox.backends.gvisor import GVisorBackend
    from rollbox.baselines.store import BaselineStore
    from rollbox.config import Home
    from rollbox.models import SandboxSpec

    async def main():
        home = Home.from_env()
        be = GVisorBackend(home)
        be.prepare()
        bl = BaselineStore(home).resolve(sys.argv[1])
        for _ in range(3):
            h = await be.create(SandboxSpec(baseline=bl.digest, backend="gvisor"), bl)
            await h.exec("setsid sleep 600 >/dev/null 2>&1 &")
        print("ready", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_cleanup_after_sigkilled_owner(
    gvisor: GVisorBackend, gv_baseline: BaselineInfo, gv_home: Home
) -> None:
    before = HostState.capture(gv_home.sandboxes)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, gv_baseline.digest],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ROLLBOX_HOME": str(gv_home.root)},
    )
    assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert len(gvisor.list_runsc_containers()) == 3
    dry = gvisor.cleanup_orphans(dry_run=True)
    assert sum(line.startswith("sandbox ") for line in dry) == 3
    lines = gvisor.cleanup_orphans()
    assert sum(line.startswith("runsc container ") for line in lines) == 3
    assert gvisor.list_runsc_containers() == []
    assert list(Path(runsc_root(gv_home)).iterdir()) == []
    assert _mine(gv_home, before, HostState.capture(gv_home.sandboxes)) == {}
