"""Fixtures for baseline integration tests: a tiny busybox rootfs (fast to import and to
build on) and a loopback docker-registry."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import BaselineInfo

TINY_NAME = "rbxtest/busybox:1"
APPLETS = ["sh", "echo", "cat", "ls", "sleep", "id", "mkdir", "chown", "touch", "rm", "true"]


def make_tiny_rootfs(root: Path) -> Path:
    """A minimal rootfs: busybox-static + applet links + passwd with root and uid 1234."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox-static is not installed")
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nworker:x:1234:1234::/home/worker:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nworker:x:1234:\n")
    for d in ("tmp", "root", "home/worker"):
        (root / d).mkdir(parents=True)
    os.chmod(root / "tmp", 0o1777)
    os.chown(root / "home" / "worker", 1234, 1234)
    return root


@pytest.fixture
def store(home: Home) -> BaselineStore:
    return BaselineStore(home)


@pytest.fixture
def tiny(store: BaselineStore, tmp_path: Path) -> Iterator[BaselineInfo]:
    """The tiny busybox baseline, imported into the test's home as ``rbxtest/busybox:1``.

    Its digest is unique to the test (file mtimes), so the copy a build hands to the
    machine-wide containers-storage is removed afterwards without touching anyone else's.
    """
    info = store.import_rootfs(make_tiny_rootfs(tmp_path / "tinyroot"), names=[TINY_NAME])
    yield info
    subprocess.run(
        ["buildah", "rmi", f"localhost/rollbox-base:{info.digest[7:]}"],
        capture_output=True,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A docker-registry on 127.0.0.1 with a temp config; yields ``127.0.0.1:PORT``."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.skip("docker-registry is not installed")
    port = free_port()
    cfg = tmp_path / "registry.yml"
    cfg.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {tmp_path / 'registry-data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        [exe, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("docker-registry did not come up") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
