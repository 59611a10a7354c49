"""Provenance digests of rollout and run records.

A rollout's digest is ``sha256`` over:

* the line ``rollbox-provenance/1``;
* the canonical record: its JSON with sorted keys, no whitespace, UTF-8, without the
  ``provenance_digest`` field;
* for every blob the record references, in (name, digest) order, a line
  ``<name> NUL <sha256 of the blob's content>``.

``seal`` hashes each referenced blob's stored content and refuses to seal a record whose
blob is missing or differs from its reference, so for a sealed record the content hash
equals the referenced digest. ``check`` then tells apart a tampered record (its digest no
longer matches) from a tampered or missing blob (its content no longer hashes to the
reference), and names which.

A run is sealed over its canonical record, which lists every rollout id with that
rollout's digest, so a deleted or added rollout record is detected too.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from rollbox.errors import CorruptionError
from rollbox.models import BlobRef, RolloutRecord, RunRecord
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

_TAG = b"rollbox-provenance/1\n"


def canonical(record: BaseModel) -> bytes:
    """The record as sorted-key compact JSON (UTF-8) without its ``provenance_digest``."""
    # Derived from pydantic's JSON form (what the database stores), so values that JSON
    # cannot carry as-is (NaN, bytes, tuples...) hash the same before and after a round trip.
    data = json.loads(record.model_dump_json(exclude={"provenance_digest"}))
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(record: RolloutRecord, blob_hashes: list[tuple[str, str]]) -> str:
    h = hashlib.sha256(_TAG)
    h.update(canonical(record))
    for name, content_hash in sorted(blob_hashes):
        h.update(b"\n" + name.encode() + b"\0" + content_hash.encode())
    return "sha256:" + h.hexdigest()


def _refs(record: RolloutRecord) -> list[BlobRef]:
    return record.blob_refs()


def compute(record: RolloutRecord, blobs: BlobStore) -> str:
    """The provenance digest of ``record`` with the stored blobs' content as they are now.

    Raises:
        CorruptionError: a referenced blob is missing or does not match its reference.
    """
    hashes = []
    for ref in _refs(record):
        blobs.check(ref.digest)
        hashes.append((ref.name, ref.digest))
    return _digest(record, hashes)


def seal(record: RolloutRecord, blobs: BlobStore) -> RolloutRecord:
    """A copy of ``record`` carrying its provenance digest. Seal again after any change.

    Raises:
        CorruptionError: a referenced blob is missing or does not match its reference.
    """
    return record.model_copy(update={"provenance_digest": compute(record, blobs)})


def check(
    record: RolloutRecord, blobs: BlobStore, hashes: dict[str, str | None] | None = None
) -> list[str]:
    """Problems with a stored rollout record and its blobs (empty when all is intact).

    Each problem is one line naming the rollout and what is wrong: a blob missing, a blob
    whose content changed, the record not sealed, or the record itself tampered with.

    Args:
        record: The stored record.
        blobs: The blob store.
        hashes: Memo of content hashes (digest -> recomputed hash) shared across the records
            of one check, so a blob many records share (the task copy) is read once.
    """
    problems: list[str] = []
    memo: dict[str, str | None] = {} if hashes is None else hashes
    for ref in _refs(record):
        if ref.digest not in memo:
            memo[ref.digest] = blobs.hash_of(ref.digest)
        actual = memo[ref.digest]
        if actual is None:
            problems.append(f"rollout {record.id}: blob {ref.name!r} ({ref.digest}) is missing")
        elif actual != ref.digest:
            problems.append(
                f"rollout {record.id}: blob {ref.name!r} ({ref.digest}) was modified: its"
                f" content now hashes to {actual}"
            )
    if record.provenance_digest is None:
        problems.append(f"rollout {record.id}: record is not sealed (no provenance digest)")
    else:
        expected = _digest(record, [(r.name, r.digest) for r in _refs(record)])
        if expected != record.provenance_digest:
            problems.append(
                f"rollout {record.id}: record was tampered with (provenance digest"
                f" {record.provenance_digest} recorded, {expected} recomputed)"
            )
    return problems


def run_digest(run: RunRecord) -> str:
    """The provenance digest of a run record as it is now."""
    return "sha256:" + hashlib.sha256(_TAG + canonical(run)).hexdigest()


def seal_run(run: RunRecord, rollouts: list[RolloutRecord]) -> RunRecord:
    """A copy of ``run`` listing every rollout's digest, and carrying its own digest.

    Raises:
        CorruptionError: a rollout is not sealed.
    """
    unsealed = [r.id for r in rollouts if r.provenance_digest is None]
    if unsealed:
        raise CorruptionError(f"rollouts not sealed: {', '.join(unsealed[:5])}")
    listed = {r.id: str(r.provenance_digest) for r in rollouts}
    sealed = run.model_copy(update={"rollouts": listed, "provenance_digest": None})
    return sealed.model_copy(update={"provenance_digest": run_digest(sealed)})


def check_run(run: RunRecord, rollouts: dict[str, str | None]) -> list[str]:
    """Problems with a sealed run record against its stored rollouts.

    Args:
        run: The stored run record.
        rollouts: id -> recorded provenance digest of every rollout stored for the run.
    """
    problems: list[str] = []
    if run.provenance_digest is None:
        return problems
    expected = run_digest(run)
    if expected != run.provenance_digest:
        problems.append(
            f"run {run.id}: record was tampered with (provenance digest"
            f" {run.provenance_digest} recorded, {expected} recomputed)"
        )
    for rid, digest in sorted(run.rollouts.items()):
        if rid not in rollouts:
            problems.append(f"run {run.id}: rollout record {rid} is missing")
        elif rollouts[rid] != digest:
            problems.append(
                f"rollout {rid}: its provenance digest {rollouts[rid]} differs from the one"
                f" the run sealed ({digest})"
            )
    for rid in sorted(set(rollouts) - set(run.rollouts)):
        problems.append(f"run {run.id}: rollout record {rid} was added after the run was sealed")
    return problems


def finalize_run(meta: MetaStore, run: RunRecord) -> RunRecord:
    """Seal ``run`` over its stored rollouts and save it; return the sealed record.

    Call it once the run's last rollout record is saved (and again after ``--resume``).

    Raises:
        CorruptionError: a stored rollout is not sealed.
    """
    sealed = seal_run(run, meta.rollouts_of(run.id))
    meta.update_run(sealed)
    return sealed
