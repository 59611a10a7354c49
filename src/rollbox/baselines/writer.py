"""The narrow store interface that baseline builders write through.

Builders (``baselines/builders/*``) take a :class:`StoreWriter` instead of importing
:class:`~rollbox.baselines.store.BaselineStore`, so the store can import its builders lazily
without an import cycle. ``BaselineStore`` satisfies this protocol structurally (mypy checks it
wherever the store passes itself to a builder).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from rollbox.config import Home
from rollbox.models import BaselineInfo, BaselineSource


class StoreWriter(Protocol):
    """What a builder needs from the baseline store: look-ups, staging, commits, a cache."""

    home: Home
    """The data home (locks, tmp, oci layout) the store lives in."""

    def lock(self) -> AbstractContextManager[None]:
        """Hold the store's write lock."""
        ...

    def staging(self, label: str = "") -> AbstractContextManager[Path]:
        """A private staging directory, removed when the block exits."""
        ...

    def blob_path(self, digest: str) -> Path:
        """Where blob ``digest`` is stored."""
        ...

    def resolve(self, ref: str) -> BaselineInfo:
        """A baseline by digest, digest prefix or name (raises when nothing matches)."""
        ...

    def find_name(self, name: str) -> BaselineInfo | None:
        """The baseline carrying ``name``, or None."""
        ...

    def add_names(self, info: BaselineInfo, names: list[str]) -> BaselineInfo:
        """Give ``info`` the ``names`` (taken from any other baseline), under the lock."""
        ...

    def commit_image(
        self,
        stage: Path,
        source: BaselineSource,
        *,
        names: list[str] | None = None,
        parent: str | None = None,
        trusted: bool = False,
    ) -> BaselineInfo:
        """Add the image in skopeo ``dir:`` layout at ``stage`` to the store."""
        ...

    def import_layer_tar(
        self,
        tar_path: Path,
        source: BaselineSource,
        *,
        names: list[str] | None = None,
        created_by: str = "rollbox import",
    ) -> BaselineInfo:
        """A one-layer baseline from an uncompressed rootfs tar."""
        ...

    def cache_get(self, kind: str, key: str) -> BaselineInfo | None:
        """The baseline cached under ``kind``/``key`` if it is still in the store."""
        ...

    def cache_put(self, kind: str, key: str, digest: str) -> None:
        """Remember that ``kind``/``key`` produced ``digest``."""
        ...


__all__ = ["StoreWriter"]
