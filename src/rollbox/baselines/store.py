"""The baseline store (interface agreed for the other components; implementation pending)."""

from __future__ import annotations

from pathlib import Path

from rollbox.config import Home
from rollbox.models import BaselineInfo, SnapshotSource


class BaselineStore:
    """OCI image layout + unpacked layers under ``home``."""

    def __init__(self, home: Home) -> None:
        self.home = home

    def resolve(self, ref: str) -> BaselineInfo:
        """A baseline by digest, unique digest prefix or name."""
        raise NotImplementedError

    def default(self) -> BaselineInfo:
        """The default Debian baseline, bootstrapped on first use."""
        raise NotImplementedError

    def layer_dirs(self, digest: str) -> list[Path]:
        """Unpacked, overlay-ready layer directories of a baseline, bottom first."""
        raise NotImplementedError

    def commit_snapshot(
        self, parent: str, upper: Path, source: SnapshotSource, name: str | None = None
    ) -> BaselineInfo:
        """A new baseline: ``parent`` plus the overlay upper dir ``upper`` as a top layer."""
        raise NotImplementedError
