"""Where rollbox keeps its data: ``ROLLBOX_HOME`` and the layout below it.

Layout (documented in docs/data-home.md; every component owns only its own subtree)::

    $ROLLBOX_HOME/                 default /var/lib/rollbox (root), ~/.local/share/rollbox otherwise
      oci/                         OCI image layout: oci-layout, index.json, blobs/sha256/<hex>
      layers/<diffid-hex>/         each layer unpacked once, read-only, overlay-ready
      baselines/<hex>.json         metadata per baseline (names, source, parent, size, created_at)
      cache/                       build caches (recipe hash -> digest, build-input hash -> digest)
      sandboxes/<sbx-id>/          one directory per live sandbox (state.json + runtime files)
      vm/                          guest kernel, initramfs, per-digest ext4 images, memory snapshots
      blobs/sha256/ab/<hex>        content-addressed blobs of rollouts (logs, artifacts, tasks)
      rollbox.db                   SQLite metadata of runs and rollouts (WAL)
      locks/                       advisory lock files (flock)
      tmp/                         staging; anything here may be deleted by ``rollbox cleanup``
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


def default_home() -> Path:
    """The data home when ``ROLLBOX_HOME`` is unset."""
    if os.geteuid() == 0:
        return Path("/var/lib/rollbox")
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "rollbox"


@dataclass(frozen=True)
class Home:
    """Paths below one rollbox data home."""

    root: Path

    @classmethod
    def from_env(cls) -> Home:
        """The home named by ``ROLLBOX_HOME``, or the default one.

        Raises:
            InvalidInputError: the path (or one of its parents) is not a directory.
        """
        env = os.environ.get("ROLLBOX_HOME")
        home = cls(Path(env).absolute() if env else default_home())
        home.check(f"ROLLBOX_HOME={env}" if env else f"the data home {home.root}")
        return home

    def check(self, what: str = "the data home") -> None:
        """Refuse a home that cannot be a directory: it, or its nearest existing parent, is
        a file (or anything else that is not a directory).

        Raises:
            InvalidInputError: naming the offending path, in one line.
        """
        from rollbox.errors import InvalidInputError

        p = self.root
        while not p.exists() and not p.is_symlink() and p != p.parent:
            p = p.parent
        if not p.is_dir():
            where = "" if p == self.root else f": {p}"
            raise InvalidInputError(
                f"{what}{where} is not a directory",
                hint="point ROLLBOX_HOME at a directory, or at a path that does not exist yet",
            )

    @property
    def tag(self) -> str:
        """8 hex chars naming this home; host-wide resources (cgroups, netns, veths) carry it
        so that ``rollbox cleanup`` of one home never touches another home's sandboxes."""
        return hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    @property
    def oci(self) -> Path:
        return self.root / "oci"

    @property
    def layers(self) -> Path:
        return self.root / "layers"

    @property
    def baselines(self) -> Path:
        return self.root / "baselines"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def sandboxes(self) -> Path:
        return self.root / "sandboxes"

    @property
    def vm(self) -> Path:
        return self.root / "vm"

    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    @property
    def db_path(self) -> Path:
        return self.root / "rollbox.db"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def ensure(self) -> Home:
        """Create the top-level directories (idempotent) and return self.

        Raises:
            InvalidInputError: the home is not a directory or cannot be created.
        """
        from rollbox.errors import InvalidInputError

        self.check()
        try:
            for p in (self.root, self.locks, self.tmp):
                p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidInputError(
                f"cannot create the data home {self.root}: {exc.strerror or exc}",
                hint="set ROLLBOX_HOME to a writable directory",
            ) from None
        return self
