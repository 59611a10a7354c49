"""Export a run as JSONL: one rollout per line, ready for training pipelines.

Each line is one JSON object (schema ``rollbox.rollout/1``, documented in docs/store.md):
flat training-friendly fields first (ids, task, instruction, agent, seed, status, reward,
passed...), the full provenance record under ``record``, and with ``include_blobs`` the
content of every referenced blob under ``blobs`` (UTF-8 text when it decodes, else base64).
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from typing import Any, TextIO

from rollbox.models import RolloutRecord
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

EXPORT_SCHEMA = "rollbox.rollout/1"
"""Value of every line's ``schema`` field."""

_INSTRUCTION_NAMES = ("instruction.md", "./instruction.md")


def _instruction(blobs: BlobStore, rec: RolloutRecord, cache: dict[str, str | None]) -> str | None:
    """``instruction.md`` from the stored task copy (a tar), when there is one."""
    ref = rec.task_blob
    if ref is None or not blobs.has(ref.digest):
        return None
    if ref.digest in cache:
        return cache[ref.digest]
    text: str | None = None
    try:
        with tarfile.open(fileobj=io.BytesIO(blobs.get(ref.digest))) as tar:
            for name in _INSTRUCTION_NAMES:
                try:
                    f = tar.extractfile(name)
                except KeyError:
                    continue
                if f is not None:
                    text = f.read().decode("utf-8", "replace")
                    break
    except (tarfile.TarError, OSError):
        text = None
    cache[ref.digest] = text
    return text


def _blob_entry(blobs: BlobStore, name: str, digest: str) -> dict[str, Any]:
    if not blobs.has(digest):
        return {"name": name, "missing": True}
    data = blobs.get(digest)
    try:
        return {"name": name, "size": len(data), "encoding": "utf-8", "data": data.decode()}
    except UnicodeDecodeError:
        return {
            "name": name,
            "size": len(data),
            "encoding": "base64",
            "data": base64.b64encode(data).decode(),
        }


def rollout_line(
    rec: RolloutRecord,
    blobs: BlobStore,
    include_blobs: bool,
    cache: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """The export object of one rollout."""
    v = rec.verifier
    line: dict[str, Any] = {
        "schema": EXPORT_SCHEMA,
        "run_id": rec.run_id,
        "rollout_id": rec.id,
        "task": rec.task_name,
        "task_digest": rec.task_digest,
        "instruction": _instruction(blobs, rec, {} if cache is None else cache),
        "attempt": rec.attempt,
        "group_id": rec.group_id,
        "agent": rec.agent,
        "seed": rec.seed,
        "baseline_digest": rec.baseline_digest,
        "backend": rec.backend,
        "status": rec.status,
        "error": rec.error,
        "error_kind": rec.error_kind,
        "reward": v.reward if v else None,
        "rewards": v.rewards if v else None,
        "passed": v.passed if v else None,
        "final": rec.retried_by is None,
        "retry_of": rec.retry_of,
        "retried_by": rec.retried_by,
        "provenance_digest": rec.provenance_digest,
        "record": rec.model_dump(mode="json"),
    }
    if include_blobs:
        line["blobs"] = {r.digest: _blob_entry(blobs, r.name, r.digest) for r in rec.blob_refs()}
    return line


def export_run(
    meta: MetaStore, blobs: BlobStore, run_id: str, out: TextIO, include_blobs: bool
) -> int:
    """Write every rollout of ``run_id`` to ``out`` as JSONL; return the number of lines.

    Raises:
        RunNotFoundError: no such run.
    """
    meta.get_run(run_id)  # raises when the run does not exist
    cache: dict[str, str | None] = {}
    n = 0
    for rec in meta.rollouts_of(run_id):
        line = rollout_line(rec, blobs, include_blobs, cache)
        out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        n += 1
    return n
