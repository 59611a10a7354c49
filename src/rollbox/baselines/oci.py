"""OCI image documents: media types, config/manifest construction and parsing.

Images travel between rollbox and skopeo/buildah in skopeo's ``dir:`` layout (a directory
with ``manifest.json`` and one file per blob named by its hex digest): it keeps the
manifest bytes exactly as the source had them, so imported digests are preserved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox.errors import StoreError
from rollbox.models import ImageConfig, LayerInfo

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = {OCI_MANIFEST, DOCKER_MANIFEST}
INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
REF_NAME = "org.opencontainers.image.ref.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def canonical(doc: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no spaces) of ``doc``."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class Descriptor:
    """An OCI content descriptor."""

    media_type: str
    digest: str
    size: int

    def to_doc(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def make_config(
    diff_ids: list[str],
    *,
    base: dict[str, Any] | None = None,
    created_by: str = "rollbox",
    runtime: ImageConfig | None = None,
) -> dict[str, Any]:
    """An image config: ``base``'s (if any) with ``diff_ids`` and one more history entry.

    No timestamps, so the same content always gives the same config digest.
    """
    doc: dict[str, Any]
    if base is not None:
        doc = json.loads(json.dumps(base))
    else:
        doc = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": [DEFAULT_PATH], "Cmd": ["/bin/bash"]},
        }
    if runtime is not None:
        cfg = doc.setdefault("config", {})
        cfg["Env"] = runtime.env
        cfg["WorkingDir"] = runtime.workdir
        if runtime.user:
            cfg["User"] = runtime.user
        if runtime.cmd:
            cfg["Cmd"] = runtime.cmd
    doc["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    history = list(doc.get("history") or [])
    history.append({"created_by": created_by})
    doc["history"] = history
    return doc


def make_manifest(
    config: Descriptor, layers: list[Descriptor], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """An OCI image manifest."""
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {**config.to_doc(), "mediaType": OCI_CONFIG},
        "layers": [d.to_doc() for d in layers],
    }
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return doc


@dataclass
class ParsedImage:
    """A manifest and its config, parsed."""

    manifest: dict[str, Any]
    media_type: str
    config_desc: Descriptor
    layers: list[Descriptor]
    config: dict[str, Any]
    diff_ids: list[str]

    def layer_infos(self) -> list[LayerInfo]:
        return [
            LayerInfo(digest=d.digest, diff_id=diff, size=d.size, media_type=d.media_type)
            for d, diff in zip(self.layers, self.diff_ids, strict=True)
        ]

    def runtime(self) -> ImageConfig:
        cfg = self.config.get("config") or {}
        return ImageConfig(
            env=list(cfg.get("Env") or []),
            workdir=cfg.get("WorkingDir") or "/",
            user=cfg.get("User") or "",
            cmd=list(cfg.get("Cmd") or []),
            entrypoint=list(cfg.get("Entrypoint") or []),
        )


def _desc(doc: Any, what: str) -> Descriptor:
    try:
        return Descriptor(str(doc["mediaType"]), str(doc["digest"]), int(doc["size"]))
    except (KeyError, TypeError, ValueError):
        raise StoreError(f"malformed {what} descriptor in manifest")


def parse_manifest(raw: bytes) -> tuple[dict[str, Any], str, Descriptor, list[Descriptor]]:
    """Parse manifest bytes into ``(doc, media type, config descriptor, layer descriptors)``.

    Raises:
        StoreError: not a single-platform OCI or Docker v2 schema 2 image manifest.
    """
    try:
        doc = json.loads(raw)
    except ValueError:
        raise StoreError("image manifest is not JSON")
    media = doc.get("mediaType") or (OCI_MANIFEST if "config" in doc else "")
    if media in INDEX_TYPES or "manifests" in doc:
        raise StoreError("got an image index, expected one platform's manifest")
    if media not in MANIFEST_TYPES or doc.get("schemaVersion") != 2:
        raise StoreError(f"unsupported manifest type {media or 'schema 1'!r}")
    config = _desc(doc.get("config"), "config")
    layers = [_desc(d, "layer") for d in doc.get("layers") or []]
    return doc, media, config, layers


def parse_config(raw: bytes, n_layers: int) -> tuple[dict[str, Any], list[str]]:
    """Parse config bytes into ``(doc, diff_ids)``, checking one diff_id per layer."""
    try:
        doc = json.loads(raw)
        diff_ids = [str(d) for d in doc["rootfs"]["diff_ids"]]
    except (ValueError, KeyError, TypeError):
        raise StoreError("image config is malformed (no rootfs.diff_ids)")
    if len(diff_ids) != n_layers:
        raise StoreError(f"image config lists {len(diff_ids)} diff_ids for {n_layers} layers")
    return doc, diff_ids


def write_dir_layout(stage: Path, manifest: bytes) -> None:
    """Finish a skopeo ``dir:`` layout in ``stage`` (blobs must already be there)."""
    (stage / "manifest.json").write_bytes(manifest)
    (stage / "version").write_text("Directory Transport Version: 1.1\n")
