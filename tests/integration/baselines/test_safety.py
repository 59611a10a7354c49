"""Concurrent builds/imports of the same input, and SIGKILL mid-build."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollbox.baselines.builders.buildah import build
from rollbox.baselines.store import BaselineStore
from rollbox.baselines.verify import verify
from rollbox.models import BaselineInfo

from .conftest import TINY_NAME, make_tiny_rootfs

pytestmark = [pytest.mark.root, pytest.mark.slow]

_BUILD = """
import sys
from pathlib import Path
from rollbox.baselines.builders.buildah import build
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
print(build(BaselineStore(Home(Path(sys.argv[1]))), Path(sys.argv[2])).digest)
"""
_IMPORT = """
import sys
from pathlib import Path
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
print(BaselineStore(Home(Path(sys.argv[1]))).import_rootfs(Path(sys.argv[2])).digest)
"""


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_two_processes_build_same_input(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {TINY_NAME}\nRUN echo built > /built && sleep 1\n")
    procs = [_spawn(_BUILD, str(store.home.root), str(ctx)) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    digests = {o[0].strip() for o in outs}
    assert len(digests) == 1
    assert len(store.all()) == 2  # tiny + one build
    assert verify(store).ok
    assert list(store.home.tmp.iterdir()) == []


def test_two_processes_import_same_rootfs(store: BaselineStore, tmp_path: Path) -> None:
    root = make_tiny_rootfs(tmp_path / "r")
    procs = [_spawn(_IMPORT, str(store.home.root), str(root)) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert len({o[0].strip() for o in outs}) == 1
    assert len(store.all()) == 1
    assert verify(store).ok


@pytest.mark.parametrize("whole_group", [True, False], ids=["group", "rollbox-only"])
def test_sigkill_mid_build_leaves_nothing_partial(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path, whole_group: bool
) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    marker = f"rbx-sigkill-{store.home.tag}"
    (ctx / "Dockerfile").write_text(f"FROM {TINY_NAME}\nRUN echo x > /x && sleep 60 # {marker}\n")
    layers_before = sorted(p.name for p in store.home.layers.iterdir())
    proc = _spawn(_BUILD, str(store.home.root), str(ctx))
    deadline = time.monotonic() + 60
    while not any(p.name.startswith("bl-build") for p in store.home.tmp.iterdir()):
        assert time.monotonic() < deadline, "build never started"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(1.5)  # let buildah get into the RUN step
    if whole_group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:  # only rollbox dies: buildah gets SIGTERM (parent-death signal) and stops
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, "buildah kept running after rollbox died"
        time.sleep(0.1)
    # nothing partial: no new baseline, no new layer, no cache entry
    assert [b.digest for b in store.all()] == [tiny.digest]
    assert sorted(p.name for p in store.home.layers.iterdir()) == layers_before
    assert not list(store.home.cache.glob("build-*"))
    # the dead process's staging is removed by the next write, and the same build works
    (ctx / "Dockerfile").write_text(f"FROM {TINY_NAME}\nRUN echo x > /x\n")
    info = build(store, ctx)
    assert list(store.home.tmp.iterdir()) == []
    assert (store.layer_dirs(info.digest)[-1] / "x").read_text() == "x\n"
    assert verify(store).ok
    images = subprocess.run(
        ["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [i for i in images if f"rollbox-build:{store.home.tag}-" in i] == []
    # buildah killed by SIGKILL cannot remove its working container (SIGTERM does, see
    # the rollbox-only case): remove the one made from this test's unique base image
    base_image = f"localhost/rollbox-base:{tiny.digest[7:]}"
    ctrs = subprocess.run(
        ["buildah", "containers", "--format", "{{.ContainerID}} {{.ImageName}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for line in ctrs:
        if line.split()[-1] == base_image:
            subprocess.run(["buildah", "rm", line.split()[0]], capture_output=True, check=False)
    # ... nor its RUN step's scratch dir (/var/tmp/buildahNNN): remove the one of this test
    for scratch in Path("/var/tmp").glob("buildah*"):
        with contextlib.suppress(OSError):
            if marker in (scratch / "config.json").read_text():
                shutil.rmtree(scratch)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
