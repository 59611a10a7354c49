"""``rollbox verify``: recompute every digest of a run and name whatever does not match.

Checks, per rollout row: the stored document parses; every query column (each repeats a
document field: status, reward, task name, ...) agrees with the document, so an edit of one
in the database shows; every referenced blob exists and still hashes to its reference; the
provenance digest recomputes; retry links point at stored records. For the run row: its
query columns (status, timestamps, owner pid) agree with its document. For a sealed run: the
run record's own digest, and that the set of rollouts and their digests is exactly the one
sealed (a deleted or added record shows).
"""

from __future__ import annotations

import json
import math

from pydantic import ValidationError

from rollbox.errors import StoreError
from rollbox.models import Model, RolloutRecord, RunRecord
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore, rollout_columns, run_columns

_UNFINISHED = ("queued", "running")


class VerifyReport(Model):
    """Outcome of ``verify_run``."""

    run_id: str
    """The run checked."""
    ok: bool
    """No problem found."""
    sealed: bool
    """The run record carries a digest over its rollouts."""
    rollouts_checked: int
    """Rollout records checked."""
    blobs_checked: int
    """Blob references checked."""
    distinct_blobs: int = 0
    """Distinct blobs re-hashed from disk (each once, however many records share it)."""
    problems: list[str] = []
    """One line per problem: what is tampered or missing."""
    warnings: list[str] = []
    """Limits of the check (e.g. an unsealed, still running run)."""


def _same(stored: object, expected: object) -> bool:
    if isinstance(stored, float) and isinstance(expected, float):
        # a reward can be NaN; NaN is not equal to itself but is no edit
        return stored == expected or (math.isnan(stored) and math.isnan(expected))
    return stored == expected


def _column_problems(
    what: str, columns: dict[str, object], expected: dict[str, object]
) -> list[str]:
    """One line per query column that differs from the value the document implies."""
    out = []
    for name, want in expected.items():
        stored = columns.get(name)
        if not _same(stored, want):
            out.append(
                f"{what}: column {name} is {stored!r} in the table but {want!r}"
                " in the record (edited in the database)"
            )
    return out


def verify_run(meta: MetaStore, blobs: BlobStore, run_id: str) -> VerifyReport:
    """Check every record and blob of run ``run_id``.

    Raises:
        RunNotFoundError: no such run.
    """
    problems: list[str] = []
    warnings: list[str] = []
    try:
        run: RunRecord | None = meta.get_run(run_id)
    except StoreError as exc:
        run = None
        problems.append(f"run {run_id}: {exc.message} (record tampered with)")
    if run is not None:
        raw_run = meta.raw_run(run_id)
        if raw_run is not None:
            problems += _column_problems(f"run {run_id}", raw_run.columns, run_columns(run))
    raws = meta.raw_rollouts_of(run_id)
    digests: dict[str, str | None] = {}
    records: list[RolloutRecord] = []
    blob_count = 0
    hashes: dict[str, str | None] = {}  # each distinct blob is re-hashed once per verify
    for raw in raws:
        rid = str(raw.columns["id"])
        try:
            rec = RolloutRecord.model_validate_json(raw.doc)
        except (ValidationError, ValueError) as exc:
            detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            problems.append(f"rollout {rid}: record cannot be read ({detail}): tampered with")
            try:
                doc = json.loads(raw.doc)
                digests[rid] = doc.get("provenance_digest") if isinstance(doc, dict) else None
            except ValueError:
                digests[rid] = None
            continue
        records.append(rec)
        digests[rid] = rec.provenance_digest
        problems += _column_problems(f"rollout {rec.id}", raw.columns, rollout_columns(rec))
        blob_count += len(rec.blob_refs())
        found = provenance.check(rec, blobs, hashes)
        if rec.provenance_digest is None and rec.status in _UNFINISHED:
            warnings.append(f"rollout {rec.id}: unfinished ({rec.status}), not sealed yet")
            found = [p for p in found if "not sealed" not in p]
        problems += found
    linked = {i for r in records for i in (r.retry_of, r.retried_by) if i is not None}
    present = set(digests) | meta.rollout_ids(sorted(linked - set(digests)))
    for r in records:
        for label, other in (("retry_of", r.retry_of), ("retried_by", r.retried_by)):
            if other is not None and other not in present:
                problems.append(f"rollout {r.id}: {label} names rollout {other}, which is missing")
    sealed = run is not None and run.provenance_digest is not None
    if run is not None:
        if sealed:
            problems += provenance.check_run(run, digests)
        elif run.status == "running":
            warnings.append(
                f"run {run.id} is still running (or was killed): not sealed, so a deleted"
                " rollout record cannot be detected"
            )
        else:
            warnings.append(
                f"run {run.id} ({run.status}) is not sealed: a deleted rollout record cannot be"
                " detected"
            )
    return VerifyReport(
        run_id=run_id,
        ok=not problems,
        sealed=sealed,
        rollouts_checked=len(raws),
        blobs_checked=blob_count,
        distinct_blobs=len(hashes),
        problems=problems,
        warnings=warnings,
    )
