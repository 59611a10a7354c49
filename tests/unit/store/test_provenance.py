"""Provenance digests: sealing, tamper detection of records and blobs, run sealing."""

from __future__ import annotations

import json

import pytest

from rollbox.errors import CorruptionError
from rollbox.models import RolloutRecord, VerifierOutcome
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore

from .records import make_rollout, make_run


def _flip_byte(blobs: BlobStore, digest: str) -> None:
    p = blobs.path(digest)
    p.chmod(0o644)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x20
    p.write_bytes(bytes(raw))


def test_canonical_is_sorted_compact_and_excludes_digest(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x")
    text = provenance.canonical(rec).decode()
    doc = json.loads(text)
    assert "provenance_digest" not in doc
    assert list(doc) == sorted(doc)
    assert ", " not in text and ": " not in text
    # survives a JSON round trip (what the database does) byte for byte
    again = RolloutRecord.model_validate_json(rec.model_dump_json())
    assert provenance.canonical(again) == provenance.canonical(rec)


def test_sealed_record_checks_clean(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x")
    assert rec.provenance_digest is not None
    assert rec.provenance_digest.startswith("sha256:")
    assert provenance.check(rec, blobs) == []
    # sealing is deterministic
    assert provenance.seal(rec, blobs).provenance_digest == rec.provenance_digest


def test_record_edit_is_named(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x", reward=0.0)
    forged = rec.model_copy(update={"verifier": VerifierOutcome(reward=1.0, passed=True)})
    problems = provenance.check(forged, blobs)
    assert len(problems) == 1
    assert rec.id in problems[0] and "tampered" in problems[0]


def test_one_changed_byte_in_a_log_blob_is_named(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x")
    assert rec.stdout is not None
    _flip_byte(blobs, rec.stdout.digest)
    problems = provenance.check(rec, blobs)
    assert problems == [p for p in problems if "'stdout'" in p and "modified" in p]
    assert len(problems) == 1


def test_missing_blob_is_named_and_cannot_be_sealed(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x")
    assert rec.trajectory is not None
    blobs.path(rec.trajectory.digest).unlink()
    problems = provenance.check(rec, blobs)
    assert len(problems) == 1 and "'trajectory.json'" in problems[0] and "missing" in problems[0]
    with pytest.raises(CorruptionError, match="missing"):
        provenance.seal(rec, blobs)


def test_unsealed_record_is_a_problem(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x", seal=False)
    assert provenance.check(rec, blobs) == [
        f"rollout {rec.id}: record is not sealed (no provenance digest)"
    ]


def test_digest_covers_blob_names(blobs: BlobStore) -> None:
    rec = make_rollout(blobs, "run-x")
    assert rec.stdout is not None
    renamed = rec.model_copy(update={"stdout": rec.stdout.model_copy(update={"name": "other"})})
    assert provenance.check(renamed, blobs) != []


def test_run_seal_detects_missing_added_and_changed_rollouts(blobs: BlobStore) -> None:
    run = make_run()
    ros = [make_rollout(blobs, run.id, attempt=i) for i in range(3)]
    sealed = provenance.seal_run(run, ros)
    digests: dict[str, str | None] = {r.id: r.provenance_digest for r in ros}
    assert provenance.check_run(sealed, digests) == []
    missing = dict(list(digests.items())[1:])
    assert any("missing" in p and ros[0].id in p for p in provenance.check_run(sealed, missing))
    added = {**digests, "ro-extra": "sha256:" + "0" * 64}
    assert any("ro-extra" in p and "added" in p for p in provenance.check_run(sealed, added))
    changed = {**digests, ros[1].id: "sha256:" + "1" * 64}
    assert any(ros[1].id in p for p in provenance.check_run(sealed, changed))
    forged = sealed.model_copy(update={"agent": "nop"})
    assert any("run" in p and "tampered" in p for p in provenance.check_run(forged, digests))


def test_seal_run_refuses_unsealed_rollouts(blobs: BlobStore) -> None:
    run = make_run()
    with pytest.raises(CorruptionError, match="not sealed"):
        provenance.seal_run(run, [make_rollout(blobs, run.id, seal=False)])
