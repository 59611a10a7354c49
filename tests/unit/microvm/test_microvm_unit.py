"""microVM pieces that need no VM: wire framing, path normalisation, preflight checks,
snapshot records, the initramfs archive."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rollbox.backends.microvm import MicroVMBackend
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.guest_agent import T_DATA, T_JSON, Parser, frame, jframe
from rollbox.backends.microvm.initramfs import _cpio
from rollbox.backends.microvm.sandbox_base import normalize
from rollbox.config import Home
from rollbox.errors import (
    CorruptionError,
    InvalidInputError,
    LimitsError,
    NotFoundError,
    PathEscapeError,
)
from rollbox.ids import new_id
from rollbox.models import HostPort, Limits, NetworkPolicy, SandboxSpec

DIGEST = "sha256:" + "a" * 64


def test_parser_splits_frames_across_reads_and_resyncs_after_garbage() -> None:
    wire = b"\x00garbage RB" + jframe({"id": 7, "op": "x"}) + frame(T_DATA, 7, b"payload")
    p = Parser()
    got = []
    for i in range(0, len(wire), 3):  # worst case: tiny reads
        got += p.feed(wire[i : i + 3])
    assert [(k, s) for k, s, _ in got] == [(T_JSON, 7), (T_DATA, 7)]
    assert got[1][2] == b"payload"


def test_normalize_refuses_climbing_above_root() -> None:
    assert normalize("/a/./b/../c") == "/a/c"
    assert normalize("tmp/x") == "/tmp/x"
    for bad in ("/../etc/passwd", "../../etc", "/a/../../b"):
        with pytest.raises(PathEscapeError):
            normalize(bad)
    with pytest.raises(InvalidInputError):
        normalize("")


def test_preflight_refuses_what_a_vm_here_cannot_do(home: Home) -> None:
    be = MicroVMBackend(home)
    allow = NetworkPolicy(mode="allow", allow=[HostPort(host="127.0.0.1", port=80)])
    be.check(SandboxSpec(baseline=DIGEST, backend="microvm", network=allow))  # supported
    with pytest.raises(LimitsError):
        be.check(SandboxSpec(baseline=DIGEST, backend="microvm", limits=Limits(memory_mb=8)))
    with pytest.raises(LimitsError):
        be.check(SandboxSpec(baseline=DIGEST, backend="microvm", limits=Limits(disk_mb=4)))
    with pytest.raises(InvalidInputError, match="not a memory snapshot id"):
        be.check(SandboxSpec(baseline=DIGEST, backend="microvm", from_snapshot="nope"))
    with pytest.raises(NotFoundError):
        be.check(SandboxSpec(baseline=DIGEST, backend="microvm", from_snapshot=new_id("snap")))
    be.check(SandboxSpec(baseline=DIGEST, backend="microvm", network=NetworkPolicy()))


def test_snapshot_record_size_check(home: Home) -> None:
    sid = new_id("snap")
    d = snaps.snap_dir(home, sid)
    d.mkdir(parents=True)
    (d / "disk.qcow2").write_bytes(b"")
    (d / "memory.bin").write_bytes(b"x" * 10)
    rec = snaps.MemorySnapshot(
        id=sid, source="sbx-x", baseline=DIGEST, vm={}, memory_size=20,
        memory_sha256="0" * 64, disk_mb=16, accelerator="tcg", kernel="k",
    )  # fmt: skip
    snaps.save(home, rec)
    assert snaps.load(home, sid) == rec
    with pytest.raises(CorruptionError, match="truncated"):
        snaps.check_size(home, rec)
    (d / "meta.json").write_text("{not json")
    with pytest.raises(CorruptionError):
        snaps.load(home, sid)


def test_cpio_archive_lists_with_gnu_cpio(tmp_path: Path) -> None:
    data = _cpio(
        [("bin", 0o40755, b""), ("bin/x", 0o100755, b"abc"), ("dev/console", 0o20600, b"")]
    )
    archive = tmp_path / "a.cpio"
    archive.write_bytes(data)
    out = subprocess.run(
        ["cpio", "-t", "-v", "--quiet"], input=data, capture_output=True, check=True
    ).stdout.decode()
    assert "bin/x" in out and "dev/console" in out and out.splitlines()[2].startswith("c")
