"""Export a run as JSONL: one rollout per line, ready for training pipelines.

Each line is one JSON object (schema ``rollbox.rollout/1``, see "JSONL export" in docs/store.md):
flat training-friendly fields first (ids, task, instruction, agent, seed, status, reward,
passed...), the full provenance record under ``record``, and with ``include_blobs`` the
content of every referenced blob under ``blobs`` (UTF-8 text when it decodes, else base64).
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from typing import Any, Literal, TextIO

from pydantic import ConfigDict, Field

from rollbox.models import ErrorKind, LimitReason, RecordModel, RolloutRecord, RolloutStatus
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


class ExportBlob(RecordModel):
    """The content of one referenced blob (``--include-blobs``)."""

    name: str
    """The reference's name (``stdout``, ``trajectory.json``, an artifact path...)."""
    size: int | None = None
    """Size in bytes (None when missing)."""
    encoding: Literal["utf-8", "base64"] | None = None
    """How ``data`` encodes the bytes: UTF-8 text when they decode, else base64."""
    data: str | None = None
    """The content."""
    missing: bool = False
    """The blob is not in the store (``rollbox verify`` names it)."""


class ExportLine(RecordModel):
    """One line of ``rollbox export``: one rollout (schema ``rollbox.rollout/1``)."""

    schema_: Literal["rollbox.rollout/1"] = Field(default="rollbox.rollout/1", alias="schema")
    """Always ``rollbox.rollout/1``."""
    run_id: str
    """The run."""
    rollout_id: str
    """The rollout."""
    task: str
    """Task name."""
    task_digest: str
    """Task identity (sha256 of its directory)."""
    instruction: str | None
    """``instruction.md`` from the stored task copy, when there is one."""
    attempt: int
    """Attempt number (0-based)."""
    group_id: str | None
    """Attempts forked from one post-setup snapshot share it."""
    agent: str
    """Agent spec."""
    seed: int | None
    """Seed handed to the agent."""
    baseline_digest: str | None
    """Baseline the sandbox started from."""
    backend: str
    """Backend that isolated it."""
    status: RolloutStatus
    """Outcome class."""
    error: str | None
    """Why it failed."""
    error_kind: ErrorKind | None
    """Whose fault the error is."""
    reasons: list[LimitReason] = []
    """Sandbox limits the rollout reached (``oom_killed``, ``pids_exhausted``, ``disk_full``,
    ``ttl_expired``)."""
    reward: float | None
    """The scalar reward."""
    rewards: dict[str, float] | None
    """The whole ``reward.json``, when written."""
    passed: bool | None
    """The verifier's verdict."""
    final: bool
    """Not superseded by a retry (the attempts to train on)."""
    retry_of: str | None
    """The failed rollout this one retries."""
    retried_by: str | None
    """The rollout that retried this one."""
    provenance_digest: str | None
    """The record's provenance digest."""
    record: RolloutRecord
    """The full provenance record."""
    blobs: dict[str, ExportBlob] | None = None
    """Only with ``--include-blobs``: every referenced blob by digest."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_attribute_docstrings=True)


def _blob_entry(blobs: BlobStore, name: str, digest: str) -> ExportBlob:
    if not blobs.has(digest):
        return ExportBlob(name=name, missing=True)
    data = blobs.get(digest)
    try:
        return ExportBlob(name=name, size=len(data), encoding="utf-8", data=data.decode())
    except UnicodeDecodeError:
        return ExportBlob(
            name=name, size=len(data), encoding="base64", data=base64.b64encode(data).decode()
        )


def rollout_line(
    rec: RolloutRecord,
    blobs: BlobStore,
    include_blobs: bool,
    cache: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """The export object of one rollout (an ``ExportLine`` as JSON data)."""
    v = rec.verifier
    line = ExportLine(
        run_id=rec.run_id,
        rollout_id=rec.id,
        task=rec.task_name,
        task_digest=rec.task_digest,
        instruction=_instruction(blobs, rec, {} if cache is None else cache),
        attempt=rec.attempt,
        group_id=rec.group_id,
        agent=rec.agent,
        seed=rec.seed,
        baseline_digest=rec.baseline_digest,
        backend=rec.backend,
        status=rec.status,
        error=rec.error,
        error_kind=rec.error_kind,
        reasons=list(rec.reasons),
        reward=v.reward if v else None,
        rewards=v.rewards if v else None,
        passed=v.passed if v else None,
        final=rec.retried_by is None,
        retry_of=rec.retry_of,
        retried_by=rec.retried_by,
        provenance_digest=rec.provenance_digest,
        record=rec,
        blobs=(
            {r.digest: _blob_entry(blobs, r.name, r.digest) for r in rec.blob_refs()}
            if include_blobs
            else None
        ),
    )
    data = line.model_dump(mode="json", by_alias=True)
    if not include_blobs:
        del data["blobs"]
    return data


def json_schema() -> dict[str, Any]:
    """JSON Schema of one export line (committed as docs/store-export.schema.json)."""
    return ExportLine.model_json_schema(by_alias=True)


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
