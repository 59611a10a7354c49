"""Memory snapshots: a paused VM's RAM and device state plus its frozen disk overlay.

``$ROLLBOX_HOME/vm/snapshots/<snap-id>/`` holds the memory, ``disk.qcow2`` (the sandbox's
writable disk as it was at that instant, read-only from then on; later overlays use it as
their backing file) and ``meta.json`` (the VM config to restore with, the baseline under
it, sizes and digests). The memory is either split (layout ``split``, the default):
``ram.img``, the guest RAM as a sparse image that restores map copy-on-write, and
``state.bin``, the migration stream without those pages (see
:mod:`~rollbox.backends.microvm.memfile`); or one QEMU migration stream ``memory.bin``
(layout ``stream``). A restore checks sizes first and the digests before the guest runs,
and refuses a mismatch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from rollbox.config import Home
from rollbox.errors import CorruptionError, InvalidInputError, NotFoundError
from rollbox.ids import is_id
from rollbox.models import Model, utcnow


class SnapshotNotFoundError(NotFoundError):
    """No memory snapshot with that id in this home."""


class MemorySnapshot(Model):
    """The record of one memory snapshot (``meta.json``)."""

    id: str
    """``snap-<ulid>``."""
    created_at: datetime = Field(default_factory=utcnow)
    """When it was taken (UTC)."""
    source: str
    """The sandbox it was taken of."""
    baseline: str
    """Digest of the filesystem baseline under it (its disk holds the changes on top)."""
    vm: dict[str, Any]
    """The VM config (:class:`~rollbox.backends.microvm.qemu.VMConfig`) to restore with."""
    memory_size: int
    """Size of the stream QEMU loads (``state.bin`` or ``memory.bin``) in bytes."""
    memory_sha256: str
    """sha256 of that stream."""
    layout: str = "stream"
    """``split`` (``ram.img`` + ``state.bin``) or ``stream`` (``memory.bin``)."""
    ram_size: int = 0
    """Size of ``ram.img`` (split layout)."""
    ram_digest: str = ""
    """:func:`~rollbox.backends.microvm.memfile.ram_digest` of ``ram.img`` (split layout)."""
    ram_stat: list[int] = []
    """``ram.img``'s (inode, size, mtime, ctime) right after it was written and hashed: a
    restore re-hashes the image only when this changed (any write, truncation or
    replacement changes it; ``ctime`` cannot be set back), as git's index does."""
    disk_mb: int
    """Virtual size of the disk in MiB."""
    accelerator: str
    """``kvm`` or ``tcg``."""
    kernel: str
    """Guest kernel version."""
    chain: list[str] = []
    """Earlier snapshots whose disks this one's disk is stacked on."""
    ephemeral: bool = False
    """Made by ``fork()``: removed once no sandbox and no snapshot depends on it."""
    spec: dict[str, Any] = {}
    """The source sandbox's spec (env, workdir, user...) that restored sandboxes inherit."""


def root(home: Home) -> Path:
    """Where a home's memory snapshots live."""
    return home.vm / "snapshots"


def snap_dir(home: Home, snap_id: str) -> Path:
    """The directory of one snapshot."""
    return root(home) / snap_id


def load(home: Home, snap_id: str) -> MemorySnapshot:
    """The record of ``snap_id``.

    Raises:
        InvalidInputError: not a snapshot id.
        SnapshotNotFoundError: no such snapshot.
        CorruptionError: its record is unreadable.
    """
    if not is_id(snap_id, "snap"):
        raise InvalidInputError(f"{snap_id!r} is not a memory snapshot id (snap-...)")
    path = snap_dir(home, snap_id) / "meta.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"no memory snapshot {snap_id!r} in {home.root}") from None
    try:
        return MemorySnapshot.model_validate(json.loads(text))
    except ValueError as exc:
        raise CorruptionError(f"memory snapshot {snap_id} has a corrupt record: {exc}") from None


def save(home: Home, snap: MemorySnapshot, d: Path | None = None) -> None:
    """Write the record atomically (into ``d``, default the snapshot's dir)."""
    d = d or snap_dir(home, snap.id)
    tmp = d / f".meta.{os.getpid()}.tmp"
    tmp.write_text(snap.model_dump_json(indent=1))
    os.replace(tmp, d / "meta.json")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


MEMORY_FILES = ("memory.bin", "state.bin", "ram.img")
"""Every name a snapshot's memory may have (removed together)."""


def stream_file(snap: MemorySnapshot, d: Path) -> Path:
    """The file QEMU loads with ``-incoming``."""
    return d / ("state.bin" if snap.layout == "split" else "memory.bin")


def check_size(home: Home, snap: MemorySnapshot, d: Path | None = None) -> Path:
    """The stream file to load, after checking the memory files exist with the recorded
    sizes.

    Raises:
        CorruptionError: missing or truncated.
    """
    d = d or snap_dir(home, snap.id)
    mem = stream_file(snap, d)
    if not Path(str(snap.vm.get("disk", d / "disk.qcow2"))).is_file():
        raise CorruptionError(f"memory snapshot {snap.id} has lost its disk", paths=[str(d)])
    expect = [(mem, snap.memory_size)]
    if snap.layout == "split":
        expect.append((d / "ram.img", snap.ram_size))
    for path, want in expect:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CorruptionError(
                f"memory snapshot {snap.id} has no {path.name} (fork snapshots keep only the disk)",
                paths=[str(path)],
            ) from None
        if size != want:
            raise CorruptionError(
                f"memory snapshot {snap.id} is truncated or altered: {path.name} has {size} "
                f"bytes, recorded {want}",
                paths=[str(path)],
            )
    return mem


def fingerprint(path: Path) -> list[int]:
    """(inode, size, mtime_ns, ctime_ns) of a file."""
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def remove_memory(d: Path) -> None:
    """Delete a snapshot's memory files (running restores keep their mapping)."""
    for name in MEMORY_FILES:
        with contextlib.suppress(OSError):
            os.unlink(d / name)


def all_snapshots(home: Home) -> list[MemorySnapshot]:
    """Every readable snapshot record of a home."""
    out = []
    try:
        names = sorted(os.listdir(root(home)))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            out.append(load(home, name))
        except (InvalidInputError, CorruptionError):
            continue
    return out


def remove(home: Home, snap_id: str) -> None:
    """Delete a snapshot's directory."""
    shutil.rmtree(snap_dir(home, snap_id), ignore_errors=True)
