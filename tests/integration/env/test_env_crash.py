"""A trainer process SIGKILLed mid-episode: ``rollbox cleanup`` removes the episode's sandbox
and marks its run interrupted; the host keeps nothing naming it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.store.metadata import MetaStore

pytestmark = [pytest.mark.root]

ROLLBOX = str(Path(sys.executable).with_name("rollbox"))
HELLO = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "hello-file"
TRAINER = f"""
import time
from rollbox.env import TaskEnv
env = TaskEnv.create({str(HELLO)!r}, caller="killed")
env.reset()
env.step("echo work > /app/w.txt")
print(env.run.id, env.aio.sandbox.id, flush=True)
time.sleep(600)
"""


def test_sigkill_mid_episode_then_cleanup(linked_home: Home) -> None:
    before = HostState.capture(linked_home.sandboxes)
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        run_id, sbx = proc.stdout.readline().split()
        assert (linked_home.sandboxes / sbx).exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert (linked_home.sandboxes / sbx).exists()  # the kill left it behind

    out = subprocess.run(
        [ROLLBOX, "cleanup", "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert any(line.startswith(f"run {run_id}:") for line in json.loads(out.stdout)["removed"])
    assert not (linked_home.sandboxes / sbx).exists()
    left = [i for items in before.diff(HostState.capture(linked_home.sandboxes)).values()
            for i in items if sbx in i]  # fmt: skip
    assert left == []
    with MetaStore(home=linked_home) as meta:
        assert meta.get_run(run_id).status == "interrupted"
