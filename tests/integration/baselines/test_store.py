"""The store with real layers: import, resolve, snapshot over a real overlay, tag, rm,
gc, verify."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from rollbox.baselines.gc import gc
from rollbox.baselines.store import BaselineStore
from rollbox.baselines.verify import verify
from rollbox.config import Home
from rollbox.errors import (
    BaselineNotFoundError,
    InUseError,
    InvalidDigestError,
    InvalidInputError,
)
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, SandboxInfo, SandboxSpec, SnapshotSource, utcnow

from .conftest import TINY_NAME, make_tiny_rootfs

pytestmark = pytest.mark.root


def _fake_live_sandbox(home: Home, sbx_id: str, baseline: str) -> None:
    d = home.sandboxes / sbx_id
    d.mkdir(parents=True)
    info = SandboxInfo(
        id=sbx_id,
        backend="namespace",
        baseline=baseline,
        spec=SandboxSpec(baseline=baseline),
        state="running",
        created_at=utcnow(),
    )
    (d / "state.json").write_text(info.model_dump_json())


def _snapshot(store: BaselineStore, base: BaselineInfo, tmp: Path, name: str) -> BaselineInfo:
    """Mount an overlay over ``base``, change things, snapshot the upper dir."""
    for d in ("u", "w", "m"):
        (tmp / d).mkdir()
    lowers = ":".join(str(p) for p in reversed(store.layer_dirs(base.digest)))
    opts = f"lowerdir={lowers},upperdir={tmp / 'u'},workdir={tmp / 'w'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(tmp / "m")], check=True)
    try:
        m = tmp / "m"
        (m / "root" / "hello.txt").write_text("hi")
        (m / "etc" / "group").unlink()
        subprocess.run(["rm", "-rf", str(m / "home")], check=True)
        (m / "home").mkdir()
        (m / "home" / "new").write_text("n")
    finally:
        subprocess.run(["umount", str(tmp / "m")], check=True)
    src = SnapshotSource(sandbox_id="sbx-test", backend="namespace")
    return store.commit_snapshot(base.digest, tmp / "u", src, name=name)


def test_import_dir_is_deterministic_and_resolvable(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    again = store.import_rootfs(make_tiny_rootfs(tmp_path / "again"))
    # different mtimes → maybe a different digest, but the same dir twice is the same
    assert store.import_rootfs(tmp_path / "again").digest == again.digest
    assert store.resolve(tiny.digest).digest == tiny.digest
    assert store.resolve(tiny.digest[7:19]).digest == tiny.digest
    assert store.resolve(tiny.digest[:20]).digest == tiny.digest
    assert store.resolve(TINY_NAME).digest == tiny.digest
    assert store.resolve("docker.io/rbxtest/busybox:1").digest == tiny.digest
    (layer,) = store.layer_dirs(tiny.digest)
    assert (layer / "bin" / "busybox").is_file()
    assert os.stat(layer / "home" / "worker").st_uid == 1234
    assert tiny.source.type == "import"
    assert tiny.config.env and tiny.config.env[0].startswith("PATH=")
    index = json.loads((store.home.oci / "index.json").read_text())
    assert tiny.digest in {m["digest"] for m in index["manifests"]}
    with pytest.raises(BaselineNotFoundError, match="no baseline 'sha256:0000000000'"):
        store.resolve("sha256:0000000000")
    with pytest.raises(InvalidDigestError):
        store.resolve("sha256:zz")
    with pytest.raises(BaselineNotFoundError, match="no baseline named 'nope:1'"):
        store.resolve("nope:1")
    with pytest.raises(InvalidInputError, match="does not exist"):
        store.import_rootfs(tmp_path / "missing")
    (tmp_path / "notatar").write_text("hello")
    with pytest.raises(InvalidInputError, match="not a tar archive"):
        store.import_rootfs(tmp_path / "notatar")


def test_ambiguous_prefix(store: BaselineStore, tiny: BaselineInfo) -> None:
    # forge a second metadata file sharing the first 8 hex digits
    other = tiny.digest[:15] + "f" * (71 - 15)
    forged = tiny.model_copy(update={"digest": other, "names": []})
    store.meta_path(other).write_text(forged.model_dump_json())
    with pytest.raises(InvalidDigestError, match="ambiguous"):
        store.resolve(tiny.digest[7:15])


def test_import_tarball_gz(store: BaselineStore, tmp_path: Path) -> None:
    root = make_tiny_rootfs(tmp_path / "r")
    subprocess.run(["tar", "-czf", str(tmp_path / "r.tar.gz"), "-C", str(root), "."], check=True)
    info = store.import_rootfs(tmp_path / "r.tar.gz", names=["gz:1"])
    (layer,) = store.layer_dirs(info.digest)
    assert (layer / "bin" / "busybox").is_file()
    assert info.layers[0].media_type == "application/vnd.oci.image.layer.v1.tar"


def test_snapshot_lineage_and_whiteouts(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    snap = _snapshot(store, tiny, tmp_path, "snap:1")
    assert snap.parent == tiny.digest
    assert snap.source.type == "snapshot"
    assert [ly.digest for ly in snap.layers[:-1]] == [ly.digest for ly in tiny.layers]
    top = store.layer_dirs(snap.digest)[-1]
    gone = os.lstat(top / "etc" / "group")
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0
    assert os.getxattr(top / "home", "trusted.overlay.opaque") == b"y"
    assert [b.digest for b in store.lineage("snap:1")] == [snap.digest, tiny.digest]
    # mounting the new baseline shows the changes
    m = tmp_path / "m2"
    m.mkdir()
    lowers = ":".join(str(p) for p in reversed(store.layer_dirs(snap.digest)))
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lowers}", str(m)], check=True
    )
    try:
        assert (m / "root" / "hello.txt").read_text() == "hi"
        assert not (m / "etc" / "group").exists()
        assert os.listdir(m / "home") == ["new"]
        assert (m / "etc" / "passwd").exists()
    finally:
        subprocess.run(["umount", str(m)], check=True)
    assert time.monotonic() - t0 < 5


def test_tag_moves_names(store: BaselineStore, tiny: BaselineInfo, tmp_path: Path) -> None:
    other = store.import_rootfs(make_tiny_rootfs(tmp_path / "o"))
    store.tag(other.digest, "moving:1")
    assert store.resolve("moving:1").digest == other.digest
    store.tag(tiny.digest, "moving:1")
    assert store.resolve("moving:1").digest == tiny.digest
    assert "moving:1" not in (store.get(other.digest) or other).names
    store.untag("moving:1")
    with pytest.raises(BaselineNotFoundError):
        store.resolve("moving:1")


def test_rm_refused_in_use_and_gc_keeps_used_layers(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path, home: Home
) -> None:
    snap = _snapshot(store, tiny, tmp_path, "snap:1")
    _fake_live_sandbox(home, "sbx-01aaaaaaaaaaaaaaaaaaaaaaaa", snap.digest)
    # the sandbox uses snap directly and tiny through snap's layers
    assert store.in_use(snap.digest) == ["sbx-01aaaaaaaaaaaaaaaaaaaaaaaa"]
    assert store.in_use(tiny.digest) == ["sbx-01aaaaaaaaaaaaaaaaaaaaaaaa"]
    with pytest.raises(InUseError, match="in use by sbx-01a"):
        store.remove(snap.digest)
    assert store.get(snap.digest) is not None
    store.remove(snap.digest, force=True)
    store.remove(tiny.digest, force=True)
    assert store.all() == []
    report = gc(store)
    assert report.layers == []  # every layer is mounted by the live sandbox
    for d in [ly.diff_id for ly in snap.layers]:
        assert store.layer_path(d).is_dir()
    # the sandbox goes away: now gc frees everything
    state = home.sandboxes / "sbx-01aaaaaaaaaaaaaaaaaaaaaaaa" / "state.json"
    state.write_text(state.read_text().replace('"running"', '"destroyed"'))
    dry = gc(store, dry_run=True)
    assert len(dry.layers) == 2 and all(store.layer_path(d).is_dir() for d in dry.layers)
    report = gc(store)
    assert sorted(report.layers) == sorted(ly.diff_id for ly in snap.layers)
    assert list(store.home.layers.iterdir()) == []
    assert list((store.home.oci / "blobs" / "sha256").iterdir()) == []


def test_gc_only_removes_unreferenced(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    snap = _snapshot(store, tiny, tmp_path, "snap:1")
    store.remove("snap:1")
    report = gc(store)
    assert report.layers == [snap.layers[-1].diff_id]
    assert store.layer_dirs(tiny.digest)[0].is_dir()
    assert verify(store).ok


def test_verify_names_flipped_byte(store: BaselineStore, tiny: BaselineInfo) -> None:
    assert verify(store).ok
    (layer,) = store.layer_dirs(tiny.digest)
    target = layer / "etc" / "passwd"
    data = bytearray(target.read_bytes())
    data[3] ^= 0x01
    target.write_bytes(bytes(data))
    report = verify(store)
    assert report.corrupt == [str(target)]
    blob = store.blob_path(tiny.layers[0].digest)
    with open(blob, "r+b") as f:
        f.seek(700)
        b = f.read(1)
        f.seek(700)
        f.write(bytes([b[0] ^ 0xFF]))
    assert f"{blob} (blob does not match its digest)" in verify(store).corrupt


def test_nothing_left_in_tmp_and_no_host_leaks(store: BaselineStore, tmp_path: Path) -> None:
    before = HostState.capture()
    info = store.import_rootfs(make_tiny_rootfs(tmp_path / "r"))
    _snapshot(store, info, tmp_path, "s:1")
    assert list(store.home.tmp.iterdir()) == []
    # other engineers' sandboxes come and go meanwhile: only look at what is ours
    leaked = before.diff(HostState.capture())
    ours = [m for ms in leaked.values() for m in ms if str(tmp_path) in m]
    assert ours == []
