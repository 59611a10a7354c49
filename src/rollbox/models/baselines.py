"""Baselines: where one comes from (its source), its layers, image config and record."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator

from rollbox.models.base import DIGEST_RE, SCHEMA_VERSION, Model


class RecipeSource(Model):
    """The baseline was bootstrapped from a Debian recipe with mmdebstrap."""

    type: Literal["recipe"] = "recipe"
    recipe_hash: str
    """sha256 of the canonical recipe JSON (the cache key)."""
    recipe: dict[str, object]
    """The recipe itself, canonicalised."""


class DockerfileSource(Model):
    """The baseline was built from a Dockerfile/Containerfile with buildah."""

    type: Literal["dockerfile"] = "dockerfile"
    input_hash: str
    """sha256 over the Dockerfile, the build args and every file of the context (cache key)."""
    dockerfile: str
    """Path of the Dockerfile as given."""
    context: str
    """Path of the build context as given."""


class ImageSource(Model):
    """The baseline was imported from an image reference by skopeo."""

    type: Literal["image"] = "image"
    reference: str
    """The transport:reference that was imported, e.g. ``docker://127.0.0.1:5000/x:1``."""


class ImportSource(Model):
    """The baseline was imported from a rootfs directory or tarball."""

    type: Literal["import"] = "import"
    path: str
    """The imported path."""
    content_hash: str
    """sha256 of the produced layer tar (deterministic for the same content)."""


class SnapshotSource(Model):
    """The baseline is a snapshot of a running sandbox: its changes as a new top layer."""

    type: Literal["snapshot"] = "snapshot"
    sandbox_id: str
    """The sandbox the snapshot was taken of."""
    backend: str
    """That sandbox's backend."""


BaselineSource = Annotated[
    RecipeSource | DockerfileSource | ImageSource | ImportSource | SnapshotSource,
    Field(discriminator="type"),
]


class LayerInfo(Model):
    """One layer of a baseline."""

    digest: str
    """Digest of the layer blob as stored (what the manifest lists)."""
    diff_id: str
    """Digest of the uncompressed layer tar (names the unpacked directory)."""
    size: int
    """Size of the blob in bytes."""
    media_type: str
    """OCI media type of the blob."""


class ImageConfig(Model):
    """The runtime parts of the OCI image config that a sandbox honours."""

    env: list[str] = []
    """``KEY=VALUE`` entries."""
    workdir: str = "/"
    """Working directory for commands."""
    user: str = ""
    """User (name or uid[:gid]) commands run as; empty means root."""
    cmd: list[str] = []
    """Default command (informational)."""
    entrypoint: list[str] = []
    """Entrypoint (informational; rollbox runs its own agent)."""


class BaselineInfo(Model):
    """Metadata of one baseline in the store."""

    schema_version: int = SCHEMA_VERSION
    """Record schema version."""
    digest: str
    """Identity: the OCI manifest digest, ``sha256:<64 hex>``."""
    names: list[str] = []
    """Names/tags pointing at it, e.g. ``debian:bookworm``, ``rollbox/default``."""
    source: BaselineSource
    """How it was made."""
    parent: str | None = None
    """Digest of the baseline it was derived from (lineage), if any."""
    layers: list[LayerInfo]
    """Layers, bottom first."""
    config: ImageConfig = ImageConfig()
    """Runtime config from the image."""
    size: int
    """Total size of the layer blobs in bytes."""
    created_at: datetime
    """When it entered this store (UTC)."""

    @field_validator("digest")
    @classmethod
    def _digest_ok(cls, v: str) -> str:
        if not DIGEST_RE.match(v):
            raise ValueError(f"not a sha256 digest: {v!r}")
        return v
