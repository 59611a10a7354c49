"""``rollbox audit`` SIGKILLed mid-run, then ``rollbox cleanup``: nothing of it is left
(its canary process dies with it; its canary dir, netns, veth and sandboxes go at cleanup)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from integration.clihelp import ROLLBOX, need_backend, run_cli
from rollbox.audit import leftovers
from rollbox.config import Home
from rollbox.models import BaselineInfo

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _owner(home: Home, timeout: float = 120) -> tuple[Path, dict[str, object]]:
    """The audit's canary dir and owner record, once its netns is recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for d in leftovers.canary_dirs(home):
            try:
                doc = json.loads((d / leftovers.OWNER).read_text())
            except (OSError, ValueError):
                continue
            if doc.get("netns"):
                return d, doc
        time.sleep(0.1)
    raise AssertionError("the audit never recorded its canaries")


def test_sigkilled_audit_then_cleanup_leaves_nothing(
    linked_home: Home, dev_baseline: BaselineInfo
) -> None:
    home = linked_home
    need_backend("namespace", home)
    env = {**os.environ, "ROLLBOX_HOME": str(home.root)}
    audit = subprocess.Popen(
        [ROLLBOX, "audit", "--backend", "namespace", "--baseline", dev_baseline.digest,
         "--probe", "timeout-no-survivors", "--probe", "pids-limit", "--json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        d, doc = _owner(home)
        # wait for its first sandbox so the kill lands mid-probe
        deadline = time.monotonic() + 120
        while not any(home.sandboxes.glob("sbx-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        audit.send_signal(signal.SIGKILL)
        audit.wait()
    netns, host_if = str(doc["netns"]), str(doc["host_if"])
    canary = int(str(doc["canary_pid"]))
    assert Path(f"/run/netns/{netns}").exists() and d.exists()  # left by the kill
    for _ in range(50):  # the canary dies with its audit (pdeathsig)
        if not leftovers.alive(canary, str(doc["canary_started"])):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the canary process outlived its audit")

    dry = run_cli(home, "cleanup", "--dry-run")
    assert f"audit leftovers {d}" in dry.stdout, dry.stdout + dry.stderr
    assert d.exists()  # a dry run removes nothing
    r = run_cli(home, "cleanup")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"audit leftovers {d}" in r.stdout and netns in r.stdout
    assert not d.exists()
    assert not Path(f"/run/netns/{netns}").exists()
    assert not Path(f"/sys/class/net/{host_if}").exists()
    assert not list(home.sandboxes.glob("sbx-*")), list(home.sandboxes.iterdir())
    assert "audit" not in run_cli(home, "cleanup", "--dry-run").stdout


def test_a_live_audit_is_not_swept(linked_home: Home) -> None:
    """The owner record of a running audit (this process) keeps its dir."""
    d = leftovers.CANARY_ROOT / f"rbx-audit-{linked_home.tag}-live"
    d.mkdir()
    try:
        leftovers.write_owner(d)
        assert leftovers.sweep(linked_home) == [] and d.exists()
        (d / leftovers.OWNER).write_text(json.dumps({"pid": os.getpid(), "started": "0"}))
        assert leftovers.sweep(linked_home) == [f"audit leftovers {d}"]  # a reused pid
        assert not d.exists()
    finally:
        if d.exists():
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
