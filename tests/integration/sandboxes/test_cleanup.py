"""Orphans: a SIGKILLed owner's sandboxes are removed by ``rollbox cleanup``; TTLs fire
even after the creator died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rollbox.backends.conformance import scoped_diff
from rollbox.backends.state import list_states
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo

pytestmark = pytest.mark.root

HOLDER = textwrap.dedent(
    """
    import asyncio, sys, time
    from rollbox.backends.namespace import NamespaceBackend
    from rollbox.baselines.store import BaselineStore
    from rollbox.config import Home
    from rollbox.models import SandboxSpec

    async def main():
        home = Home.from_env()
        base = BaselineStore(home).resolve(sys.argv[1])
        be = NamespaceBackend(home)
        ttl = float(sys.argv[3]) if sys.argv[3] != "-" else None
        for _ in range(int(sys.argv[2])):
            h = await be.create(SandboxSpec(baseline=base.digest, ttl_s=ttl), base)
            await h.exec("setsid sleep 600 >/dev/null 2>&1 &")
        print("ready", flush=True)
        if ttl is None:
            time.sleep(600)

    asyncio.run(main())
    """
)


def _holder(n: int, digest: str, ttl: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, digest, str(n), ttl],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"holder failed: {line!r}"
    return proc


def _cleanup_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", "cleanup", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_sigkilled_owner_then_cleanup_restores_host(
    sbx_home: Home, dev_baseline: BaselineInfo
) -> None:
    before = HostState.capture(sbx_home.sandboxes)
    proc = _holder(10, dev_baseline.digest, "-")
    during = HostState.capture(sbx_home.sandboxes)
    made = scoped_diff(before, during, sbx_home)
    assert len(made.get("sandbox_dirs", [])) == 10, made
    assert len([m for m in made.get("mounts", []) if m.startswith("overlay")]) == 10, made
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    dry = _cleanup_cli("--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("would remove sandbox ") == 10, dry.stdout
    assert len(list_states(sbx_home)) == 10  # dry run removed nothing

    res = _cleanup_cli()
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("removed sandbox sbx-") == 10, res.stdout
    assert "owner pid" in res.stdout
    after = HostState.capture(sbx_home.sandboxes)
    assert scoped_diff(before, after, sbx_home) == {}
    assert scoped_diff(after, before, sbx_home) == {}
    again = _cleanup_cli("--json")
    assert '"removed": []' in again.stdout


def test_live_owner_is_not_cleaned(sbx_home: Home, dev_baseline: BaselineInfo) -> None:
    proc = _holder(1, dev_baseline.digest, "-")
    try:
        res = _cleanup_cli()
        assert res.returncode == 0
        assert "sandbox sbx-" not in res.stdout
        assert len(list_states(sbx_home)) == 1
    finally:
        proc.kill()
        proc.wait()
        _cleanup_cli()
    assert list_states(sbx_home) == []


@pytest.mark.slow
def test_ttl_destroys_after_creator_exit(sbx_home: Home, dev_baseline: BaselineInfo) -> None:
    before = HostState.capture(sbx_home.sandboxes)
    proc = _holder(2, dev_baseline.digest, "1.5")
    proc.wait(timeout=30)  # the creator exits normally; the reaper process remains
    assert len(list_states(sbx_home)) == 2
    deadline = time.monotonic() + 20
    while list_states(sbx_home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list_states(sbx_home) == []
    assert scoped_diff(before, HostState.capture(sbx_home.sandboxes), sbx_home) == {}


def test_stray_dir_without_state_is_removed(sbx_home: Home) -> None:
    stray = sbx_home.sandboxes / "sbx-01stray0000000000000000000"
    (stray / "run").mkdir(parents=True)
    fresh = sbx_home.sandboxes / "sbx-01fresh0000000000000000000"
    fresh.mkdir()
    old = time.time() - 3600
    os.utime(stray, (old, old))
    res = _cleanup_cli()
    assert res.returncode == 0, res.stderr
    assert f"removed dir {stray}" in res.stdout
    assert not stray.exists()
    assert fresh.exists()  # could be a sandbox being created right now
