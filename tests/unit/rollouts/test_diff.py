"""Filesystem diff of an overlay upper dir against lower layer dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollbox.rollouts.diff import diff_upper, signature


def _layers(tmp_path: Path) -> tuple[Path, Path, Path]:
    low1, low2, upper = tmp_path / "l1", tmp_path / "l2", tmp_path / "upper"
    for d in (low1 / "etc", low1 / "app" / "sub", low2 / "app", upper):
        d.mkdir(parents=True, exist_ok=True)
    (low1 / "etc" / "conf").write_text("a")
    (low1 / "app" / "keep.txt").write_text("k")
    (low1 / "app" / "sub" / "old.txt").write_text("o")
    (low2 / "app" / "main.py").write_text("print(1)")
    return low1, low2, upper


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts are char devices: mknod needs root")
def test_added_modified_deleted_and_opaque(tmp_path: Path) -> None:
    low1, low2, upper = _layers(tmp_path)
    (upper / "app").mkdir()
    (upper / "app" / "main.py").write_text("print(2)")  # modified (copy-up)
    (upper / "app" / "new.txt").write_text("hello")  # added
    os.mknod(upper / "etc", 0o600 | 0o020000, os.makedev(0, 0))  # whole /etc deleted
    (upper / "app" / "sub").mkdir()
    os.setxattr(upper / "app" / "sub", "trusted.overlay.opaque", b"y")  # replaced dir
    (upper / "app" / "sub" / "fresh").write_text("f")
    (upper / "task").mkdir()
    (upper / "task" / "instruction.md").write_text("excluded")
    changes = {c.path: c for c in diff_upper(upper, [low1, low2])}
    assert changes["/app/main.py"].kind == "modified"
    assert changes["/app/main.py"].size == 8
    assert str(changes["/app/main.py"].sha256).startswith("sha256:")
    assert changes["/app/new.txt"].kind == "added" and changes["/app/new.txt"].size == 5
    assert changes["/etc"].kind == "deleted" and changes["/etc"].type == "dir"
    assert changes["/app/sub/old.txt"].kind == "deleted"
    assert changes["/app/sub/fresh"].kind == "added"
    assert "/app" not in changes  # a copied-up directory is not itself a change
    assert "/task/instruction.md" not in changes and "/task" not in changes
    assert "/app/keep.txt" not in changes


def test_noise_entries_are_left_out_until_they_change(tmp_path: Path) -> None:
    low1, low2, upper = _layers(tmp_path)
    (upper / "etc").mkdir()
    (upper / "etc" / "hostname").write_text("sandbox\n")
    noise = signature(upper)
    (upper / "app").mkdir()
    (upper / "app" / "x").write_text("x")
    paths = [c.path for c in diff_upper(upper, [low1, low2], noise=noise)]
    assert paths == ["/app/x"]
    (upper / "etc" / "hostname").write_text("changed by the agent\n")
    paths = [c.path for c in diff_upper(upper, [low1, low2], noise=noise)]
    assert paths == ["/app/x", "/etc/hostname"]
