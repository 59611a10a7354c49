"""Content-addressed blob store for rollouts: logs, artifacts, task copies, trajectories.

Layout: ``ROLLBOX_HOME/blobs/sha256/<first 2 hex>/<64 hex>``. A blob is written to a
staging file ``ROLLBOX_HOME/tmp/blob-*`` and renamed into place, so a reader never sees a
partial blob and concurrent writers of the same content are harmless; a staging file left by
a killed process is removed by ``rollbox cleanup`` (stale ``tmp/`` entries).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import CorruptionError, InvalidDigestError, StoreError
from rollbox.models import BlobRef

_DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
_CHUNK = 1 << 20


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _hex(digest: str) -> str:
    m = _DIGEST_RE.match(digest)
    if not m:
        raise InvalidDigestError(
            f"not a blob digest: {digest!r}", hint="expected sha256:<64 hex digits>"
        )
    return m.group(1)


class BlobStore:
    """Blobs addressed by the sha256 of their content, below ``home.blobs``."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.root = home.blobs / "sha256"
        self._tmp = home.tmp
        # digest -> (inode, size, mtime_ns) of files this process wrote or fully re-hashed;
        # lets ``check`` skip re-reading a blob whose file is untouched since (``verify``
        # and ``hash_of`` always re-read).
        self._known: dict[str, tuple[int, int, int]] = {}

    def path(self, digest: str) -> Path:
        """Where the blob with ``digest`` lives (whether or not it exists)."""
        hx = _hex(digest)
        return self.root / hx[:2] / hx

    def has(self, digest: str) -> bool:
        """True when the blob is stored."""
        return self.path(digest).is_file()

    def _remember(self, digest: str) -> None:
        try:
            st = self.path(digest).stat()
        except FileNotFoundError:
            return
        self._known[digest] = (st.st_ino, st.st_size, st.st_mtime_ns)

    def _install(self, tmp: Path, digest: str) -> None:
        dest = self.path(digest)
        if dest.is_file() and self.verify(digest):
            tmp.unlink(missing_ok=True)
            return
        # new, or a damaged copy that the fresh content repairs
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o444)
        try:
            os.replace(tmp, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # blobs/ is on another filesystem than tmp/: stage beside the target instead
            side = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            shutil.copyfile(tmp, side)
            os.chmod(side, 0o444)
            os.replace(side, dest)
            tmp.unlink()

    def _tmpfile(self) -> tuple[int, Path]:
        self._tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="blob-")
        return fd, Path(name)

    def put(self, data: bytes) -> str:
        """Store ``data``; return its digest ``sha256:<hex>`` (idempotent)."""
        digest = sha256_digest(data)
        if self.has(digest) and self.verify(digest):
            return digest
        fd, tmp = self._tmpfile()
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._install(tmp, digest)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write blob {digest}: {exc}") from exc
        self._remember(digest)
        return digest

    def put_file(self, path: Path | str) -> str:
        """Store the content of the file at ``path`` (streamed); return its digest."""
        h = hashlib.sha256()
        fd, tmp = self._tmpfile()
        try:
            with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    dst.write(chunk)
            digest = "sha256:" + h.hexdigest()
            self._install(tmp, digest)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot store {path} as a blob: {exc}") from exc
        self._remember(digest)
        return digest

    def ref(self, name: str, data: bytes, *, truncated: bool = False) -> BlobRef:
        """Store ``data`` and return a ``BlobRef`` named ``name``."""
        return BlobRef(name=name, digest=self.put(data), size=len(data), truncated=truncated)

    def ref_file(self, name: str, path: Path | str) -> BlobRef:
        """Store the file at ``path`` and return a ``BlobRef`` named ``name``."""
        digest = self.put_file(path)
        return BlobRef(name=name, digest=digest, size=self.path(digest).stat().st_size)

    def get(self, digest: str) -> bytes:
        """The content of a blob.

        Raises:
            StoreError: the blob is not stored.
        """
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"blob {digest} is missing from {self.root}") from None

    def hash_of(self, digest: str) -> str | None:
        """Recompute the sha256 of the stored blob's content; None when it is missing."""
        h = hashlib.sha256()
        try:
            with open(self.path(digest), "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        except FileNotFoundError:
            return None
        actual = "sha256:" + h.hexdigest()
        if actual == digest:
            self._remember(digest)
        else:
            self._known.pop(digest, None)
        return actual

    def verify(self, digest: str) -> bool:
        """True when the blob exists and its content still hashes to ``digest``."""
        return self.hash_of(digest) == digest

    def check(self, digest: str) -> None:
        """Raise ``CorruptionError`` unless the blob exists with the right content.

        A blob this process wrote or re-hashed, whose file (inode, size, mtime) is unchanged
        since, is not read again; any other is re-hashed.
        """
        known = self._known.get(digest)
        if known is not None:
            try:
                st = self.path(digest).stat()
                if (st.st_ino, st.st_size, st.st_mtime_ns) == known:
                    return
            except FileNotFoundError:
                pass
        actual = self.hash_of(digest)
        if actual is None:
            raise CorruptionError(f"blob {digest} is missing", paths=[str(self.path(digest))])
        if actual != digest:
            raise CorruptionError(
                f"blob {digest} was modified (content hashes to {actual})",
                paths=[str(self.path(digest))],
            )
