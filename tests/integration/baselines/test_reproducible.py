"""Reproducible baselines: the default recipe bootstrapped in two data homes, and one Dockerfile
built in two data homes (contexts made at different times), give one digest each."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rollbox.baselines.builders.bootstrap import DEFAULT_RECIPE, bootstrap
from rollbox.baselines.builders.buildah import build
from rollbox.baselines.recipe import DEFAULT_SOURCE_DATE_EPOCH
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home

from .conftest import TINY_NAME, make_tiny_rootfs

pytestmark = [pytest.mark.root, pytest.mark.slow]

# files that would carry the building machine's identity or the build's time
MACHINE_SPECIFIC = (
    "etc/machine-id",
    "var/lib/dbus/machine-id",
    "var/cache/ldconfig/aux-cache",
    "var/log/dpkg.log",
    "var/log/apt/history.log",
    "var/log/apt/term.log",
    "var/log/alternatives.log",
)


def _layer_tar(store: BaselineStore, digest: str) -> Path:
    (layer,) = store.resolve(digest).layers
    return store.blob_path(layer.digest)


def _as_another_machine(tmp_path: Path, code: str) -> str:
    """Run Python ``code`` in a process that sees another machine: its own hostname, and
    /etc/hostname, /etc/hosts, /etc/resolv.conf of other bytes and modes (what mmdebstrap
    copies in, what buildah mounts into RUN steps); return its last line of output."""
    fake = tmp_path / "other-machine"
    fake.mkdir()
    (fake / "hostname").write_text("other-machine\n")
    (fake / "hosts").write_text(Path("/etc/hosts").read_text() + "127.0.1.1 other-machine\n")
    # other bytes, same working DNS (apt still has to reach the mirror)
    real = Path("/etc/resolv.conf").read_text()
    (fake / "resolv.conf").write_text(f"# other-machine\n{real}options timeout:3\n")
    names = ("hostname", "hosts", "resolv.conf")
    for name in names:
        # modes differ between machines too (mmdebstrap's copies keep them); readable for apt
        mode = Path("/etc", name).stat().st_mode & 0o777
        (fake / name).chmod(0o664 if mode != 0o664 else 0o644)
    mounts = "; ".join(f"mount --bind {fake}/{n} /etc/{n}" for n in names)
    script = (
        f"set -e; mount --make-rprivate /; hostname other-machine; {mounts}; "
        f'exec {sys.executable} -c "$0"'
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--uts", "sh", "-c", script, code],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def _bootstrap_as_another_machine(tmp_path: Path, home: Path) -> str:
    code = (
        "from pathlib import Path; from rollbox.config import Home; "
        "from rollbox.baselines.store import BaselineStore; "
        "from rollbox.baselines.builders.bootstrap import DEFAULT_RECIPE, bootstrap; "
        f"store = BaselineStore(Home(Path({str(home)!r})).ensure()); "
        "print(bootstrap(store, DEFAULT_RECIPE).digest)"
    )
    return _as_another_machine(tmp_path, code)


def test_default_recipe_bootstraps_to_one_digest_in_two_homes(tmp_path: Path) -> None:
    a = BaselineStore(Home(tmp_path / "home-a").ensure())
    b = BaselineStore(Home(tmp_path / "home-b").ensure())
    info_a = bootstrap(a, DEFAULT_RECIPE)
    digest_b = _bootstrap_as_another_machine(tmp_path, b.home.root)
    assert info_a.digest == digest_b
    info_b = b.resolve(digest_b)
    assert [ly.digest for ly in info_a.layers] == [ly.digest for ly in info_b.layers]
    with tarfile.open(_layer_tar(a, info_a.digest)) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        hostname = tar.extractfile(members["etc/hostname"])
        resolv = tar.extractfile(members["etc/resolv.conf"])
        assert hostname is not None and hostname.read() == b"rollbox\n"
        assert resolv is not None and resolv.read() == b""
        assert members["etc/hostname"].mode == members["etc/resolv.conf"].mode == 0o644
    for path in MACHINE_SPECIFIC:
        assert path not in members or members[path].size == 0, path
    assert not [n for n in members if n.startswith("var/lib/apt/lists/") and "Release" in n]
    assert max(m.mtime for m in members.values()) <= DEFAULT_SOURCE_DATE_EPOCH
    assert {(m.uname, m.gname) for m in members.values()} <= {("", ""), ("root", "root")}


def _context(root: Path, mtime: int) -> Path:
    root.mkdir()
    (root / "Dockerfile").write_text(
        f"FROM {TINY_NAME}\nCOPY data.txt /data/\nRUN mkdir -p /out && echo built > /out/f\n"
    )
    (root / "data.txt").write_text("same bytes\n")
    for p in (root / "data.txt", root / "Dockerfile", root):
        os.utime(p, (mtime, mtime))
    return root


def test_one_dockerfile_builds_to_one_digest_in_two_homes(tmp_path: Path) -> None:
    rootfs = make_tiny_rootfs(tmp_path / "tinyroot")  # one directory: the same base bytes
    a = BaselineStore(Home(tmp_path / "home-a").ensure())
    b = BaselineStore(Home(tmp_path / "home-b").ensure())
    base_a = a.import_rootfs(rootfs, names=[TINY_NAME])
    base_b = b.import_rootfs(rootfs, names=[TINY_NAME])
    assert base_a.digest == base_b.digest
    try:
        # contexts written at different times, as on two machines
        built_a = build(a, _context(tmp_path / "ctx-a", 1_600_000_000))
        ctx_b = _context(tmp_path / "ctx-b", 1_700_000_000)
        code = (
            "from pathlib import Path; from rollbox.config import Home; "
            "from rollbox.baselines.store import BaselineStore; "
            "from rollbox.baselines.builders.buildah import build; "
            f"print(build(BaselineStore(Home(Path({str(b.home.root)!r}))), Path({str(ctx_b)!r}))"
            ".digest)"
        )
        assert _as_another_machine(tmp_path, code) == built_a.digest
        assert len(built_a.layers) == 2
        with tarfile.open(a.blob_path(built_a.layers[-1].digest)) as tar:
            mtimes = {m.mtime for m in tar.getmembers()}
        assert mtimes == {DEFAULT_SOURCE_DATE_EPOCH}
    finally:
        subprocess.run(
            ["buildah", "rmi", f"localhost/rollbox-base:{base_a.digest[7:]}"],
            capture_output=True,
            check=False,
        )
