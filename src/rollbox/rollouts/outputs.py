"""A rollout's outputs into the blob store: logs, ``/logs/agent``, artifacts; timing.

:class:`RolloutOutputs` is a base of :class:`~rollbox.rollouts.runner.RolloutRunner` (the
methods moved here from runner.py unchanged); it needs the runner's ``home``, ``blobs``,
``timing`` and ``_stored``.
"""

import asyncio
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    RollboxError,
)
from rollbox.models import (
    BlobRef,
    FsChange,
    RolloutRecord,
)
from rollbox.rollouts.tasks import Task
from rollbox.sandbox import AsyncSandbox
from rollbox.store.blobs import BlobStore

AGENT_LOG_DIR = "/logs/agent"
"""Harbor's agent log directory: collected when the agent made it."""
SMALL_BLOB = 64 << 10
"""Downloaded files up to this size are read whole and deduplicated in memory."""


@dataclass
class Timing:
    """Seconds spent inside sandbox operations (backend + sandboxed commands), per rollout;
    the rest of a rollout's wall time is rollbox's own (the benchmark reports both)."""

    backend_s: float = 0.0


class RolloutOutputs:
    """Blob storage and the collect phase of the rollout runner."""

    home: Home
    blobs: BlobStore
    timing: dict[str, Timing]
    _stored: set[str]

    def _ref(self, name: str, data: bytes, *, truncated: bool = False) -> BlobRef:
        """Store a small blob; skip the write when this process already stored that content
        (empty logs, identical outputs repeat across thousands of rollouts)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if digest not in self._stored:
            self.blobs.put(data)
            self._stored.add(digest)
        return BlobRef(name=name, digest=digest, size=len(data), truncated=truncated)

    def _time(self, rec: RolloutRecord) -> Timing:
        t = self.timing.get(rec.id)
        if t is None:
            t = self.timing[rec.id] = Timing()
        return t

    @staticmethod
    async def _read_optional(sbx: AsyncSandbox, path: str) -> bytes | None:
        try:
            return await sbx.files.read(path)
        except BackendError:
            raise
        except (RollboxError, OSError):
            return None

    async def _collect(self, rec: RolloutRecord, sbx: AsyncSandbox, task: Task) -> None:
        timing = self._time(rec)
        scratch = self.home.tmp / f"collect-{rec.id}"
        refs: list[BlobRef] = list(rec.artifacts)  # /logs/verifier, stored by _verify
        missing: list[str] = []
        t0 = time.perf_counter()
        try:
            for i, src in enumerate([*task.artifacts, AGENT_LOG_DIR]):
                dest = scratch / str(i)
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    await sbx.files.download(src, dest)
                except BackendError:
                    raise
                except (RollboxError, OSError) as exc:
                    if src != AGENT_LOG_DIR:
                        missing.append(f"{src}: {exc}")
                    continue
                if src == AGENT_LOG_DIR:
                    refs += self._store_tree(src, dest)  # usually a few small files: inline
                else:
                    refs += await asyncio.to_thread(self._store_tree, src, dest)
        finally:
            if task.artifacts:
                await asyncio.to_thread(shutil.rmtree, scratch, True)
            else:
                shutil.rmtree(scratch, True)
            timing.backend_s += time.perf_counter() - t0
        rec.artifacts = refs
        if missing:
            rec.extra = {**rec.extra, "missing_artifacts": missing}

    def _store_file(self, name: str, path: Path) -> BlobRef:
        """Store one downloaded file: small ones through :meth:`_ref` (a reward file or log
        repeated across rollouts is written once), big ones streamed."""
        if path.stat().st_size <= SMALL_BLOB:
            return self._ref(name, path.read_bytes())
        return self.blobs.ref_file(name, path)

    def _store_tree(self, src: str, dest: Path) -> list[BlobRef]:
        if dest.is_symlink() or dest.is_file():
            return [self._store_file(src, dest)] if dest.is_file() else []
        out: list[BlobRef] = []
        for dirpath, dirnames, filenames in os.walk(dest):
            dirnames.sort()
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_symlink() or not full.is_file():
                    continue
                rel = full.relative_to(dest).as_posix()
                out.append(self._store_file(f"{src.rstrip('/')}/{rel}", full))
        return out


def fs_summary(changes: list[FsChange]) -> dict[str, int]:
    """Counts of added/modified/deleted paths."""
    out = {"added": 0, "modified": 0, "deleted": 0}
    for c in changes:
        out[c.kind] += 1
    return out
