"""Layer tars: determinism and whiteout conversion in both directions."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from rollbox.baselines import layers
from rollbox.errors import StoreError


def _tar_names(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def _upper(root: Path) -> Path:
    """An overlay-style upper dir: a whiteout, an opaque dir, a hardlink and a symlink."""
    up = root / "upper"
    (up / "etc").mkdir(parents=True)
    os.mknod(up / "etc" / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (up / "opaque").mkdir()
    os.setxattr(up / "opaque", layers.OPAQUE_XATTR, b"y")
    os.setxattr(up / "etc", "trusted.overlay.impure", b"y")
    (up / "opaque" / "new.txt").write_text("new")
    (up / "a.txt").write_text("a")
    os.link(up / "a.txt", up / "b.txt")
    (up / "link").symlink_to("a.txt")
    return up


@pytest.mark.root
def test_overlay_upper_to_oci_and_back(tmp_path: Path) -> None:
    up = _upper(tmp_path)
    buf = io.BytesIO()
    diff_id, size = layers.pack_dir(up, buf, overlay=True)
    data = buf.getvalue()
    assert size == len(data)
    names = _tar_names(data)
    assert "etc/.wh.gone" in names and names["etc/.wh.gone"].isfile()
    assert "etc/gone" not in names
    assert "opaque/.wh..wh..opq" in names
    assert names["b.txt"].islnk() and names["b.txt"].linkname == "a.txt"
    assert names["link"].issym()
    assert not any("trusted.overlay" in k for m in names.values() for k in m.pax_headers)
    assert names["a.txt"].uname == "" and names["a.txt"].mtime == int(
        (up / "a.txt").stat().st_mtime
    )

    # same content, same digest
    again = io.BytesIO()
    assert layers.pack_dir(up, again, overlay=True)[0] == diff_id
    assert again.getvalue() == data

    blob = tmp_path / "blob.tar"
    blob.write_bytes(data)
    out = tmp_path / "out"
    layers.unpack_blob(blob, out)
    gone = os.lstat(out / "etc" / "gone")
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0
    assert os.getxattr(out / "opaque", layers.OPAQUE_XATTR) == b"y"
    assert not os.path.exists(out / "opaque" / ".wh..wh..opq")
    assert (out / "opaque" / "new.txt").read_text() == "new"
    assert os.stat(out / "a.txt").st_ino == os.stat(out / "b.txt").st_ino
    with pytest.raises(OSError):
        os.getxattr(out / "etc", "trusted.overlay.impure")


@pytest.mark.root
def test_oci_whiteouts_from_foreign_tar(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, is_dir in [
            ("d", True),
            ("d/.wh.x", False),
            ("e", True),
            ("e/.wh..wh..opq", False),
        ]:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
            info.mode = 0o755
            tar.addfile(info)
    blob = tmp_path / "blob.tar"
    blob.write_bytes(buf.getvalue())
    out = tmp_path / "out"
    layers.unpack_blob(blob, out)
    assert sorted(os.listdir(out / "d")) == ["x"]
    assert os.lstat(out / "d" / "x").st_rdev == 0
    assert os.listdir(out / "e") == []
    assert os.getxattr(out / "e", layers.OPAQUE_XATTR) == b"y"


def test_plain_pack_keeps_char_devices_and_is_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "f").write_text("x" * 5000)
    (src / ".wh.literal").write_text("not overlay: kept as a file")
    a, b = io.BytesIO(), io.BytesIO()
    assert layers.pack_dir(src, a)[0] == layers.pack_dir(src, b)[0]
    assert a.getvalue() == b.getvalue()
    assert list(_tar_names(a.getvalue())) == [".wh.literal", "d", "d/e", "d/e/f"]


def test_check_layer_names_changed_missing_and_extra(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"\x00" * 100)
    (root / "keep").write_text("k")
    man = tmp_path / "layer.files.json"
    layers.write_manifest(root, man)
    assert layers.check_layer(root, man) == []
    with open(root / "bin" / "tool", "r+b") as f:
        f.seek(50)
        f.write(b"\x01")
    (root / "keep").unlink()
    (root / "extra").write_text("e")
    bad = layers.check_layer(root, man)
    assert str(root / "bin" / "tool") in bad
    assert str(root / "extra") in bad
    assert f"{root / 'keep'} (missing)" in bad
    assert layers.check_layer(tmp_path / "nope", man) == [
        f"{tmp_path / 'nope'} (layer directory missing)"
    ]


@pytest.mark.root
def test_unpack_never_writes_through_a_symlink_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        link = tarfile.TarInfo("esc")
        link.type = tarfile.SYMTYPE
        link.linkname = str(outside)
        tar.addfile(link)
        data = b"pwned"
        f = tarfile.TarInfo("esc/pwned")
        f.size = len(data)
        tar.addfile(f, io.BytesIO(data))
        rel = tarfile.TarInfo("up")
        rel.type = tarfile.SYMTYPE
        rel.linkname = "../outside"
        tar.addfile(rel)
        g = tarfile.TarInfo("up/pwned2")
        g.size = len(data)
        tar.addfile(g, io.BytesIO(data))
    blob = tmp_path / "evil.tar"
    blob.write_bytes(buf.getvalue())
    try:
        layers.unpack_blob(blob, tmp_path / "out")
    except StoreError:
        pass  # refusing the archive is fine too
    assert list(outside.iterdir()) == []
