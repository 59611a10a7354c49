"""``rollbox sandbox …`` end to end, each command in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.backends.conformance import scoped_diff
from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo

pytestmark = pytest.mark.root


def rb(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_cli_lifecycle(sbx_home: Home, dev_baseline: BaselineInfo, tmp_path: Path) -> None:
    before = HostState.capture(sbx_home.sandboxes)
    r = rb(
        "sandbox",
        "create",
        "--baseline",
        dev_baseline.digest,
        "--label",
        "team=b1",
        "--env",
        "GREETING=hi",
        "--hostname",
        "box1",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    sid = info["id"]
    assert info["state"] == "running" and info["spec"]["labels"] == {"team": "b1"}

    # the creating CLI process is gone: the sandbox lives on (detached)
    r = rb(
        "sandbox", "exec", sid, "--", "sh", "-c", "echo $GREETING $(hostname); echo e >&2; exit 5"
    )
    assert (r.returncode, r.stdout, r.stderr) == (5, "hi box1\n", "e\n")
    r = rb("sandbox", "exec", sid, "--json", "--", "true")
    assert json.loads(r.stdout)["exit_code"] == 0
    r = rb("sandbox", "exec", sid, "--timeout", "0.5", "--", "sleep", "30")
    assert r.returncode == 124 and "timed out" in r.stderr

    host_file = tmp_path / "in.txt"
    host_file.write_text("payload")
    assert rb("sandbox", "cp", str(host_file), f"{sid}:/root/in.txt").returncode == 0
    assert rb("sandbox", "cp", f"{sid}:/root/in.txt", str(tmp_path / "out.txt")).returncode == 0
    assert (tmp_path / "out.txt").read_text() == "payload"
    r = rb("sandbox", "cp", f"{sid}:/../../etc/passwd", str(tmp_path / "x"))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "escapes" in r.stderr

    r = rb("sandbox", "ls")
    assert sid in r.stdout and "team=b1" in r.stdout and "running" in r.stdout
    listed = json.loads(rb("sandbox", "ls", "--json").stdout)
    assert [i["id"] for i in listed] == [sid]

    assert rb("sandbox", "pause", sid).returncode == 0
    assert json.loads(rb("sandbox", "ls", "--json").stdout)[0]["state"] == "paused"
    r = rb("sandbox", "exec", sid, "--", "true")
    assert r.returncode != 0 and "paused" in r.stderr
    assert rb("sandbox", "resume", sid).returncode == 0

    r = rb("sandbox", "fork", sid, "-n", "2", "--json")
    assert r.returncode == 0, r.stderr
    kids = [i["id"] for i in json.loads(r.stdout)]
    r = rb("sandbox", "exec", kids[0], "--", "cat", "/root/in.txt")
    assert r.stdout == "payload"

    r = rb("sandbox", "snapshot", sid, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digest"].startswith("sha256:")

    r = rb("sandbox", "rm", sid, *kids)
    assert r.returncode == 0 and r.stdout.count("removed") == 3
    r = rb("sandbox", "exec", sid, "--", "true")
    assert r.returncode == 2 and "no sandbox" in r.stderr
    assert scoped_diff(before, HostState.capture(sbx_home.sandboxes), sbx_home) == {}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["sandbox", "create", "--backend", "nope"], "unknown backend"),
        (["sandbox", "create", "--memory-mb", "0"], "--memory-mb"),
        (["sandbox", "create", "--cpus", "999"], "cpus"),
        (["sandbox", "create", "--baseline", "sha256:" + "0" * 64], "baseline"),
        (["sandbox", "create", "--network", "allow=nonsense"], "network"),
        (["sandbox", "exec", "sbx-00000000000000000000000000", "--", "true"], "no sandbox"),
        (["sandbox", "rm", "sbx-00000000000000000000000000"], "no sandbox"),
        (["sandbox", "cp", "a", "b"], "ID:/path"),
    ],
)
def test_cli_bad_input(
    sbx_home: Home, dev_baseline: BaselineInfo, args: list[str], needle: str
) -> None:
    if args[:2] == ["sandbox", "create"] and "--baseline" not in args:
        args = [*args, "--baseline", dev_baseline.digest]
    r = rb(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert list((sbx_home.sandboxes).glob("sbx-*")) == []
