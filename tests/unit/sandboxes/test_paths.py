"""Sandbox path resolution never leaves the root (no root or sandbox needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollbox.backends.namespace.files import RootFiles, normalize
from rollbox.errors import InvalidInputError, NotFoundError, PathEscapeError


@pytest.mark.parametrize(
    ("path", "want"),
    [("/", ""), ("/etc/passwd", "etc/passwd"), ("a/./b//c", "a/b/c"), ("/a/b/../c", "a/c")],
)
def test_normalize(path: str, want: str) -> None:
    assert normalize(path) == want


@pytest.mark.parametrize("path", ["..", "/..", "/a/../../b", "../../etc/passwd"])
def test_normalize_refuses_escape(path: str) -> None:
    with pytest.raises(PathEscapeError):
        normalize(path)


@pytest.mark.parametrize("path", ["", "a\0b"])
def test_normalize_refuses_garbage(path: str) -> None:
    with pytest.raises(InvalidInputError):
        normalize(path)


@given(st.lists(st.sampled_from(["a", "b", "..", ".", ""]), max_size=12))
def test_normalize_never_climbs(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    try:
        rel = normalize(path)
    except PathEscapeError:
        return
    assert ".." not in rel.split("/") and not rel.startswith("/")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc" / "hostname").write_text("box")
    (tmp_path / "outside").write_text("host secret")
    os.symlink("/etc/passwd", r / "abs")
    os.symlink("../outside", r / "rel_out")
    os.symlink("etc/hostname", r / "rel_in")
    os.symlink("../../..", r / "etc" / "up")
    os.mkfifo(r / "fifo")
    return r


def test_read_inside_and_relative_symlink(root: Path) -> None:
    f = RootFiles(root)
    assert f.read("/etc/hostname") == b"box"
    assert f.read("/rel_in") == b"box"


@pytest.mark.parametrize("path", ["/abs", "/rel_out", "/etc/up/outside", "/etc/up/etc/passwd"])
def test_read_resolves_symlinks_in_the_root(root: Path, path: str) -> None:
    """Chroot semantics: absolute and ``../..`` links land inside the root, never on the
    host (the host's /etc/passwd and ../outside exist; the root's do not)."""
    with pytest.raises(NotFoundError):
        RootFiles(root).read(path)
    assert RootFiles(root).read("/etc/up/etc/hostname") == b"box"


def test_write_stays_in_the_root(root: Path, tmp_path: Path) -> None:
    f = RootFiles(root)
    f.write("/etc/up/evil", b"x")  # clamped: the root's /evil
    assert (root / "evil").read_bytes() == b"x"
    f.write("/rel_out", b"y")  # a link at the path itself is replaced, not followed
    assert not (root / "rel_out").is_symlink() and (root / "rel_out").read_bytes() == b"y"
    assert not (tmp_path / "evil").exists()
    assert (tmp_path / "outside").read_text() == "host secret"


def test_write_makes_parents_and_mode(root: Path) -> None:
    f = RootFiles(root)
    f.write("/new/dir/file", b"data", 0o600)
    assert (root / "new" / "dir" / "file").read_bytes() == b"data"
    assert (root / "new" / "dir" / "file").stat().st_mode & 0o777 == 0o600


def test_fifo_and_missing(root: Path) -> None:
    f = RootFiles(root)
    with pytest.raises(InvalidInputError):
        f.read("/fifo")  # never blocks, never opens a non-regular file
    with pytest.raises(NotFoundError):
        f.read("/nope")


def test_upload_download_tree_links(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("1")
    os.symlink("/etc/shadow", src / "link")
    os.symlink("/up/sub/f", src / "in_abs")
    f = RootFiles(root)
    f.upload(src, "/up")
    assert os.readlink(root / "up" / "link") == "/etc/shadow"
    with pytest.raises(PathEscapeError, match="/up/link"):
        f.download("/up", tmp_path / "refused")  # a link out of the tree
    out = tmp_path / "out"
    f.download("/up", out, "content")
    assert (out / "sub" / "f").read_text() == "1"
    assert os.readlink(out / "in_abs") == "sub/f"  # in-tree: kept, made relative
    assert not (out / "link").exists() and not (out / "link").is_symlink()  # dangling inside
