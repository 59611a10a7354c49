"""Memory snapshots: a paused VM's RAM and device state plus its frozen disk overlay.

``$ROLLBOX_HOME/vm/snapshots/<snap-id>/`` holds ``memory.bin`` (the QEMU migration stream),
``disk.qcow2`` (the sandbox's writable disk as it was at that instant, read-only from then
on; later overlays use it as their backing file) and ``meta.json`` (the VM config to
restore with, the baseline under it, the memory file's size and sha256). A restore checks
the size first and the hash while streaming the file into QEMU, and refuses a mismatch.
"""

from __future__ import annotations

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
    """Size of ``memory.bin`` in bytes."""
    memory_sha256: str
    """sha256 of ``memory.bin``."""
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


def check_size(home: Home, snap: MemorySnapshot, d: Path | None = None) -> Path:
    """The memory file, after checking it exists with the recorded size.

    Raises:
        CorruptionError: missing or truncated.
    """
    d = d or snap_dir(home, snap.id)
    mem = d / "memory.bin"
    if not Path(str(snap.vm.get("disk", d / "disk.qcow2"))).is_file():
        raise CorruptionError(f"memory snapshot {snap.id} has lost its disk", paths=[str(d)])
    try:
        size = mem.stat().st_size
    except FileNotFoundError:
        raise CorruptionError(
            f"memory snapshot {snap.id} has no memory file (fork snapshots keep only the disk)",
            paths=[str(mem)],
        ) from None
    if size != snap.memory_size:
        raise CorruptionError(
            f"memory snapshot {snap.id} is truncated or altered: {size} bytes, "
            f"recorded {snap.memory_size}",
            paths=[str(mem)],
        )
    return mem


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
