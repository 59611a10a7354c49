"""JSONL export: every line parses, carries the documented fields, and blobs round-trip."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from rollbox.errors import RunNotFoundError
from rollbox.models import RolloutRecord
from rollbox.store.blobs import BlobStore
from rollbox.store.export import EXPORT_SCHEMA, ExportLine, export_run, json_schema
from rollbox.store.metadata import MetaStore

from .records import make_rollout, make_run

FIELDS = {
    "schema", "run_id", "rollout_id", "task", "task_digest", "instruction", "attempt",
    "group_id", "agent", "seed", "baseline_digest", "backend", "status", "error",
    "error_kind", "reward", "rewards", "passed", "final", "retry_of", "retried_by",
    "provenance_digest", "record", "reasons",
}  # fmt: skip


def _stored_run(meta: MetaStore, blobs: BlobStore) -> tuple[str, list[RolloutRecord]]:
    run = make_run()
    meta.create_run(run)
    ros = [make_rollout(blobs, run.id, t, a) for t in ("x", "y") for a in range(3)]
    for r in ros:
        meta.save_rollout(r)
    return run.id, ros


def test_export_lines_parse_and_match_records(meta: MetaStore, blobs: BlobStore) -> None:
    run_id, ros = _stored_run(meta, blobs)
    out = io.StringIO()
    assert export_run(meta, blobs, run_id, out, include_blobs=False) == 6
    lines = out.getvalue().splitlines()
    assert len(lines) == 6
    by_id = {r.id: r for r in ros}
    for raw in lines:
        doc = json.loads(raw)
        assert set(doc) == FIELDS
        assert doc["schema"] == EXPORT_SCHEMA
        rec = RolloutRecord.model_validate(doc["record"])
        assert rec == by_id[doc["rollout_id"]]
        assert doc["reward"] == 1.0 and doc["passed"] is True and doc["final"] is True
        assert doc["instruction"] == f"Do the {doc['task']} thing.\n"
        # every line is valid against the documented schema (strict: no unknown fields)
        assert ExportLine.model_validate_json(raw).rollout_id == doc["rollout_id"]


def test_export_with_blobs_round_trips_text_and_binary(meta: MetaStore, blobs: BlobStore) -> None:
    run_id, _ = _stored_run(meta, blobs)
    out = io.StringIO()
    export_run(meta, blobs, run_id, out, include_blobs=True)
    for raw in out.getvalue().splitlines():
        doc = json.loads(raw)
        rec = RolloutRecord.model_validate(doc["record"])
        assert set(doc["blobs"]) == {r.digest for r in rec.blob_refs()}
        for digest, entry in doc["blobs"].items():
            data = (
                entry["data"].encode()
                if entry["encoding"] == "utf-8"
                else base64.b64decode(entry["data"])
            )
            assert data == blobs.get(digest) and entry["size"] == len(data)
        assert doc["blobs"][rec.artifacts[0].digest]["encoding"] == "base64"


def test_export_unknown_run(meta: MetaStore, blobs: BlobStore) -> None:
    with pytest.raises(RunNotFoundError):
        export_run(meta, blobs, "run-nope", io.StringIO(), include_blobs=False)


def test_committed_schema_file_matches_the_code() -> None:
    path = Path(__file__).resolve().parents[3] / "docs" / "store-export.schema.json"
    committed = json.loads(path.read_text())
    assert committed == json_schema(), "regenerate docs/store-export.schema.json"
    assert {"schema", "record", "reward", "blobs"} <= set(committed["properties"])
    assert "blobs" not in committed["required"]
