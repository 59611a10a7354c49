"""Split a QEMU migration stream into a guest-RAM image and the remaining device state.

A memory snapshot is first written by QEMU as one migration stream (RAM pages and device
state interleaved). Restoring that means QEMU parses and copies every page before the guest
may run (~0.15-0.5 s for ~70 MB here). Instead the stream is split once, at snapshot time:

* ``ram.img`` — the guest-RAM block as a sparse file (page at its offset, zero pages are
  holes). A restore maps it ``MAP_PRIVATE`` (``memory-backend-file,share=off``): pages are
  read lazily from the page cache, writes are private copies, and branches of one snapshot
  share the unmodified pages.
* ``state.bin`` — the same stream with that block's page records removed (a few hundred KB:
  device state and the small ROM blocks), fed to ``-incoming``.

The parser understands the precopy stream QEMU 7.x writes without compression, XBZRLE,
multifd, postcopy or ``x-ignore-shared`` (what rollbox uses); anything else raises
:class:`UnsupportedStream` and the caller keeps the plain stream.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

FILE_MAGIC = 0x5145564D  # "QEVM"
FILE_VERSION = 3
VM_EOF, SECTION_START, SECTION_PART, SECTION_END, SECTION_FULL = 0, 1, 2, 3, 4
VM_SUBSECTION, VM_CONFIGURATION, SECTION_FOOTER = 5, 7, 0x7E

# RAM record flags (low bits of the be64 address word)
F_ZERO, F_MEM_SIZE, F_PAGE, F_EOS, F_CONTINUE = 0x02, 0x04, 0x08, 0x10, 0x20
PAGE = 4096
FLAG_MASK = PAGE - 1

RAM_BLOCK = "microvm.ram"
"""The guest-RAM block of a ``-M microvm`` VM (QEMU's default RAM backend's name)."""


class UnsupportedStream(ValueError):
    """The stream has a shape this splitter does not handle (keep it unsplit)."""


@dataclass
class Split:
    """What :func:`split` wrote."""

    ram_size: int
    ram_digest: str
    state_size: int
    state_sha256: str


class _Reader:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise UnsupportedStream("the stream ends in the middle of a record")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def be32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def be64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def idstr(self) -> bytes:
        return self.take(self.u8())

    def peek(self) -> int:
        if self.pos >= len(self.data):
            raise UnsupportedStream("the stream ends before QEMU's end marker")
        return self.data[self.pos]


def _ram_records(
    r: _Reader, out: bytearray, ram_fd: int, sizes: dict[bytes, int], name: bytes, block: bytes
) -> bytes:
    """One RAM section's records up to its end-of-section mark; returns the current block
    (a record may continue the previous section's block)."""
    while True:
        word = r.be64()
        flags, addr = word & FLAG_MASK, word & ~FLAG_MASK
        if flags & F_MEM_SIZE:
            out += struct.pack(">Q", word)
            total = addr
            while total > 0:
                bid = r.idstr()
                length = r.be64()
                sizes[bid] = length
                out += bytes([len(bid)]) + bid + struct.pack(">Q", length)
                total -= length
            if total != 0:
                raise UnsupportedStream("RAM block sizes do not add up")
            continue
        if flags == F_EOS:
            out += struct.pack(">Q", word)
            return block
        if not flags & (F_PAGE | F_ZERO) or flags & ~(F_PAGE | F_ZERO | F_CONTINUE):
            raise UnsupportedStream(f"RAM record flags {flags:#x} are not handled")
        if not flags & F_CONTINUE:
            block = r.idstr()
        elif not block:
            raise UnsupportedStream("a RAM record continues an unnamed block")
        fill = r.u8() if flags & F_ZERO else -1
        page = r.take(PAGE) if flags & F_PAGE else b""
        if block == name:
            if addr + PAGE > sizes.get(name, 0):
                raise UnsupportedStream("a RAM page lies outside its block")
            if page:
                os.pwrite(ram_fd, page, addr)
            else:
                # a zero page: a hole unless something was written there before
                os.pwrite(ram_fd, bytes([fill]) * PAGE, addr) if fill else _zero(ram_fd, addr)
            continue
        # other blocks (ROMs, ACPI tables) stay in the stream, always naming their block
        out += struct.pack(">Q", addr | (flags & ~F_CONTINUE))
        out += bytes([len(block)]) + block
        out += bytes([fill]) if fill >= 0 else page


def _zero(fd: int, offset: int) -> None:
    """Make one page read as zeros (punching a hole when the file has data there)."""
    try:
        if os.lseek(fd, offset, os.SEEK_DATA) >= offset + PAGE:
            return
    except OSError:  # ENXIO: no data at or after offset
        return
    os.pwrite(fd, bytes(PAGE), offset)


def split(stream: Path, ram_out: Path, state_out: Path, block: str = RAM_BLOCK) -> Split:
    """Split ``stream`` into ``ram_out`` (RAM block ``block`` as a sparse image) and
    ``state_out``.

    Both outputs are created exclusively (never overwriting a file a running VM maps).

    Raises:
        UnsupportedStream: the stream is not one this splitter understands; nothing is left.
    """
    if os.stat(stream).st_size < 8:
        raise UnsupportedStream("the stream is empty")
    ram_fd = os.open(ram_out, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    ok = False
    try:
        with open(stream, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            r = _Reader(m)
            out = bytearray()
            if r.be32() != FILE_MAGIC or r.be32() != FILE_VERSION:
                raise UnsupportedStream("not a QEMU migration stream (version 3)")
            out += struct.pack(">II", FILE_MAGIC, FILE_VERSION)
            if r.peek() == VM_CONFIGURATION:
                r.u8()
                n = r.be32()
                out += bytes([VM_CONFIGURATION]) + struct.pack(">I", n) + r.take(n)
            if r.peek() == VM_SUBSECTION:
                raise UnsupportedStream("the configuration has subsections")
            sizes: dict[bytes, int] = {}
            ram_id = -1
            ram_done = False
            current = b""
            while True:
                kind = r.peek()
                start = r.pos
                if kind == SECTION_START:
                    r.u8()
                    sid = r.be32()
                    if r.idstr() != b"ram":
                        raise UnsupportedStream("an iterable section other than RAM")
                    r.take(8)  # instance id, version id
                    ram_id = sid
                elif kind in (SECTION_PART, SECTION_END):
                    r.u8()
                    if r.be32() != ram_id:
                        raise UnsupportedStream("a live section other than RAM")
                    ram_done = kind == SECTION_END
                elif kind in (SECTION_FULL, VM_EOF) and ram_done:
                    out += m[r.pos :]  # device state: copied as it is
                    break
                else:
                    raise UnsupportedStream(f"unexpected section type {kind:#x}")
                out += m[start : r.pos]
                current = _ram_records(r, out, ram_fd, sizes, block.encode(), current)
                if r.peek() == SECTION_FOOTER:
                    out += r.take(5)
        size = sizes.get(block.encode())
        if not size:
            raise UnsupportedStream(f"the stream has no RAM block named {block!r}")
        os.ftruncate(ram_fd, size)
        os.fchmod(ram_fd, 0o444)
        fd = os.open(state_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        with os.fdopen(fd, "wb") as sf:
            sf.write(out)
        ok = True
        return Split(size, ram_digest(ram_out), len(out), hashlib.sha256(out).hexdigest())
    finally:
        os.close(ram_fd)
        if not ok:
            for p in (ram_out, state_out):
                p.unlink(missing_ok=True)


def ram_digest(path: Path) -> str:
    """sha256 over the data regions of a sparse RAM image (offsets included), so holes
    cost nothing to check; a truncated, extended or altered image gives another digest."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        h.update(struct.pack(">Q", size))
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole remains
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            h.update(struct.pack(">QQ", start, end))
            at = start
            while at < end:
                block = os.pread(fd, min(8 << 20, end - at), at)
                if not block:
                    break
                h.update(block)
                at += len(block)
            pos = end
    finally:
        os.close(fd)
    return h.hexdigest()
