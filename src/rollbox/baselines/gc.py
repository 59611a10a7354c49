"""Garbage collection of blobs and unpacked layers no baseline (or live sandbox) needs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel

from rollbox.baselines import oci
from rollbox.baselines.locks import remove_stale_staging
from rollbox.baselines.refs import hex_of
from rollbox.baselines.store import REMOVED_DIR, BaselineStore, _atomic_write
from rollbox.errors import StoreError
from rollbox.models import BaselineInfo


class GcReport(BaseModel):
    """What ``gc`` removed (or, with ``dry_run``, would remove)."""

    dry_run: bool
    """Nothing was removed."""
    blobs: list[str] = []
    """Digests of removed blobs."""
    layers: list[str] = []
    """Diff ids of removed unpacked layers."""
    staging: list[str] = []
    """Stale staging directories removed from ``tmp/``."""
    bytes_freed: int = 0
    """Bytes of blobs and layer directories removed."""


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def _protected(store: BaselineStore) -> list[BaselineInfo]:
    """Baselines whose blobs and layers must stay: all in the store, plus force-removed
    ones that a live sandbox still uses (their record is dropped once none does)."""
    keep = store.all()
    removed_dir = store.home.baselines / REMOVED_DIR
    live = {s.baseline for s in store.live_sandboxes()}
    for path in sorted(removed_dir.glob("*.json")) if removed_dir.is_dir() else []:
        try:
            info = BaselineInfo.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        if info.digest in live:
            keep.append(info)
        else:
            path.unlink(missing_ok=True)
    return keep


def gc(store: BaselineStore, *, dry_run: bool = False) -> GcReport:
    """Remove blobs and layer dirs that no baseline and no live sandbox references.

    Runs under the store lock, so it never races a commit; a layer a live sandbox mounts
    is always kept because its baseline's record is kept while the sandbox lives.
    """
    report = GcReport(dry_run=dry_run)
    with store.lock():
        keep_blobs: set[str] = set()
        keep_layers: set[str] = set()
        for info in _protected(store):
            keep_blobs.add(hex_of(info.digest))
            keep_layers.update(hex_of(ly.diff_id) for ly in info.layers)
            keep_blobs.update(hex_of(ly.digest) for ly in info.layers)
            try:
                _doc, _m, cfg, _l = oci.parse_manifest(store.manifest_bytes(info.digest))
                keep_blobs.add(hex_of(cfg.digest))
            except (OSError, StoreError):
                continue
        blob_dir = store.home.oci / "blobs" / "sha256"
        for blob in sorted(blob_dir.iterdir()) if blob_dir.is_dir() else []:
            if blob.name in keep_blobs:
                continue
            report.blobs.append("sha256:" + blob.name)
            report.bytes_freed += blob.stat().st_size
            if not dry_run:
                blob.unlink(missing_ok=True)
        layers = store.home.layers
        for entry in sorted(layers.iterdir()) if layers.is_dir() else []:
            name = entry.name.removesuffix(".files.json")
            if name in keep_layers or name.startswith("."):
                continue
            if entry.is_dir():
                report.layers.append("sha256:" + name)
                report.bytes_freed += _tree_size(entry)
                if not dry_run:
                    # move out first: a half-deleted layer never shows under layers/
                    with store.staging("gc") as trash:
                        os.rename(entry, trash / name)
            elif not dry_run:
                entry.unlink(missing_ok=True)
        if not dry_run:
            index = store.home.oci / "index.json"
            if index.is_file():
                doc = json.loads(index.read_bytes())
                known = {f"sha256:{b}" for b in keep_blobs}
                doc["manifests"] = [m for m in doc.get("manifests", []) if m["digest"] in known]
                _atomic_write(index, json.dumps(doc, indent=2).encode())
            report.staging = [str(p) for p in remove_stale_staging(store.home.tmp)]
            known_meta = {p.stem for p in store.home.baselines.glob("*.json")}
            for entry in store.home.cache.glob("*.json") if store.home.cache.is_dir() else []:
                try:
                    cached = str(json.loads(entry.read_text())["digest"])
                except (OSError, ValueError, KeyError):
                    cached = ""
                if cached.removeprefix("sha256:") not in known_meta:
                    entry.unlink(missing_ok=True)
    return report
