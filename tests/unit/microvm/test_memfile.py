"""The migration-stream splitter on synthetic streams in QEMU 7.x's precopy format."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rollbox.backends.microvm import memfile as mf

RAM = b"microvm.ram"
ROM = b"pc.bios"
RAM_SIZE = 8 * mf.PAGE
ROM_SIZE = 2 * mf.PAGE


def rec(addr: int, flags: int, block: bytes | None = None, body: bytes = b"") -> bytes:
    out = struct.pack(">Q", addr | flags)
    if block is not None:
        out += bytes([len(block)]) + block
    return out + body


def page(fill: int) -> bytes:
    return bytes([fill]) * mf.PAGE


def section(kind: int, sid: int, body: bytes, name: bytes | None = None) -> bytes:
    head = bytes([kind]) + struct.pack(">I", sid)
    if name is not None:
        head += bytes([len(name)]) + name + struct.pack(">II", 0, 4)
    return head + body + rec(0, mf.F_EOS) + bytes([mf.SECTION_FOOTER]) + struct.pack(">I", sid)


def stream(extra_flags: int = 0) -> bytes:
    out = struct.pack(">II", mf.FILE_MAGIC, mf.FILE_VERSION)
    out += bytes([mf.VM_CONFIGURATION]) + struct.pack(">I", 7) + b"microvm"
    sizes = rec(RAM_SIZE + ROM_SIZE, mf.F_MEM_SIZE)
    for name, size in ((RAM, RAM_SIZE), (ROM, ROM_SIZE)):
        sizes += bytes([len(name)]) + name + struct.pack(">Q", size)
    out += section(mf.SECTION_START, 2, sizes, b"ram")
    part = rec(0, mf.F_PAGE | extra_flags, RAM, page(1))
    part += rec(mf.PAGE, mf.F_ZERO | mf.F_CONTINUE, None, b"\0")
    part += rec(0, mf.F_PAGE, ROM, page(9))
    part += rec(3 * mf.PAGE, mf.F_PAGE, RAM, page(3))
    out += section(mf.SECTION_PART, 2, part)
    # continues the previous section's block (RAM) without naming it
    end = rec(5 * mf.PAGE, mf.F_PAGE | mf.F_CONTINUE, None, page(5))
    end += rec(3 * mf.PAGE, mf.F_ZERO, RAM, b"\0")  # re-sent as zero: must read as zeros
    out += section(mf.SECTION_END, 2, end)
    device = bytes([mf.SECTION_FULL]) + b"opaque device state" + bytes([mf.VM_EOF])
    return out + device


def test_split_moves_ram_pages_out_and_keeps_the_rest(tmp_path: Path) -> None:
    src = tmp_path / "memory.bin"
    src.write_bytes(stream())
    res = mf.split(src, tmp_path / "ram.img", tmp_path / "state.bin")
    ram = (tmp_path / "ram.img").read_bytes()
    assert res.ram_size == len(ram) == RAM_SIZE
    want = page(1) + page(0) + page(0) + page(0) + page(0) + page(5) + page(0) + page(0)
    assert ram == want
    state = (tmp_path / "state.bin").read_bytes()
    assert res.state_size == len(state)
    assert page(9) in state and page(1) not in state and page(5) not in state
    assert state.endswith(b"opaque device state" + bytes([mf.VM_EOF]))
    # the ROM page is kept and names its block explicitly
    assert rec(0, mf.F_PAGE, ROM, page(9)) in state
    assert res.ram_digest == mf.ram_digest(tmp_path / "ram.img")


def test_digest_sees_any_change(tmp_path: Path) -> None:
    src = tmp_path / "memory.bin"
    src.write_bytes(stream())
    res = mf.split(src, tmp_path / "ram.img", tmp_path / "state.bin")
    img = tmp_path / "ram.img"
    img.chmod(0o644)
    with open(img, "r+b") as f:
        f.seek(5 * mf.PAGE + 7)
        f.write(b"\x00")
    assert mf.ram_digest(img) != res.ram_digest
    with open(img, "r+b") as f:
        f.truncate(RAM_SIZE - mf.PAGE)
    assert mf.ram_digest(img) != res.ram_digest


@pytest.mark.parametrize(
    "data",
    [
        b"not a stream at all",
        stream()[:-3000],  # cut in the middle of a page
        b"",
        stream(extra_flags=0x100),  # a compressed page
    ],
)
def test_unsupported_streams_leave_nothing(tmp_path: Path, data: bytes) -> None:
    src = tmp_path / "memory.bin"
    src.write_bytes(data)
    with pytest.raises(mf.UnsupportedStream):
        mf.split(src, tmp_path / "ram.img", tmp_path / "state.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.bin"]
