"""``rollbox sandbox cp`` and symlinks: one contract on every backend (chroot semantics
inside, no host symlink pointing out of the destination, ``--links`` for trees)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rollbox.backends.base import Backend
from rollbox.config import Home
from rollbox.models import BaselineInfo

pytestmark = [pytest.mark.root, pytest.mark.slow]


def rb(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _host_links(root: Path) -> list[str]:
    return [
        f"{d}/{n} -> {os.readlink(os.path.join(d, n))}"
        for d, dirs, files in os.walk(root)
        for n in dirs + files
        if os.path.islink(os.path.join(d, n))
    ]


@pytest.mark.parametrize(
    "backend", ["namespace", "gvisor", pytest.param("microvm", marks=pytest.mark.vm)]
)
def test_cp_links(
    backend: str,
    sbx_home: Home,
    dev_baseline: BaselineInfo,
    backend_or_skip: Callable[[str], Backend],
    tmp_path: Path,
) -> None:
    backend_or_skip(backend)
    out = tmp_path / "out"
    out.mkdir()
    r = rb("sandbox", "create", "--backend", backend, "--baseline", dev_baseline.digest, "--json")
    assert r.returncode == 0, r.stderr
    sid = json.loads(r.stdout)["id"]
    try:
        script = (
            "echo real > /tmp/real; ln -s /tmp/real /tmp/l2; ln -s /etc/shadow /tmp/link;"
            " mkdir -p /d; echo f > /d/f; ln -s /d/f /d/in; ln -s /etc/hostname /d/out"
        )
        assert rb("sandbox", "exec", sid, "--", "sh", "-c", script).returncode == 0
        shadow = rb("sandbox", "exec", sid, "--", "cat", "/etc/shadow").stdout
        hostname = rb("sandbox", "exec", sid, "--", "cat", "/etc/hostname").stdout

        # the reported microvm bug: a link to /etc/shadow made a HOST symlink to the
        # host's /etc/shadow; now it is the sandbox's own file, copied as content
        r = rb("sandbox", "cp", f"{sid}:/tmp/link", str(out / "shadow"))
        assert r.returncode == 0, r.stderr
        assert not (out / "shadow").is_symlink()
        assert (out / "shadow").read_text() == shadow
        # the reported namespace bug: a link to a file inside was refused
        r = rb("sandbox", "cp", f"{sid}:/tmp/l2", str(out / "l2"))
        assert r.returncode == 0, r.stderr
        assert (out / "l2").read_text() == "real\n"

        r = rb("sandbox", "cp", f"{sid}:/d", str(out / "refused"))
        assert r.returncode != 0 and "/d/out" in r.stderr, r.stderr
        assert r.stderr.strip().startswith("error:") and "--links content" in r.stderr
        r = rb("sandbox", "cp", "--links", "content", f"{sid}:/d", str(out / "tree"))
        assert r.returncode == 0, r.stderr
        tree = out / "tree"
        assert (tree / "out").read_text() == hostname and not (tree / "out").is_symlink()
        assert os.readlink(tree / "in") == "f" and (tree / "in").read_text() == "f\n"
        assert all(" -> /" not in link for link in _host_links(out)), _host_links(out)

        r = rb("sandbox", "cp", "--links", "follow", f"{sid}:/d", str(out / "x"))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
        assert "--links must be one of refuse, content" in r.stderr
        r = rb("sandbox", "cp", "--links", "content", str(out / "l2"), f"{sid}:/tmp/x")
        assert r.returncode == 2 and "applies to downloads" in r.stderr
    finally:
        rb("sandbox", "rm", sid)
