"""``rollbox verify`` notices a direct database edit of EACH query column of rollouts and runs
(every column that repeats a document field), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from rollbox.models import RunRecord
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import ROLLOUT_COLUMNS, RUN_COLUMNS, MetaStore
from rollbox.store.verify import verify_run
from unit.store.records import T0, make_rollout, make_run

# A value of the column's type that differs from what the record holds.
ROLLOUT_EDITS: dict[str, Any] = {
    "id": "ro-forged",
    "run_id": None,  # set per test: another stored run
    "task_name": "other-task",
    "attempt": 7,
    "status": "failed",
    "created_at": "2020-01-01T00:00:00+00:00",
    "task_digest": "sha256:" + "00" * 32,
    "group_id": "grp-forged",
    "reward": 1.0,
    "provenance_digest": "sha256:" + "11" * 32,
}
RUN_EDITS: dict[str, Any] = {
    "created_at": "2020-01-01T00:00:00+00:00",
    "finished_at": "2020-01-02T00:00:00+00:00",
    "status": "failed",
    "owner_pid": 4242,
}


def test_every_column_has_an_edit_case() -> None:
    # a column added later without a case here fails this test instead of going unchecked
    assert set(ROLLOUT_EDITS) == set(ROLLOUT_COLUMNS)
    assert set(RUN_EDITS) | {"id"} == set(RUN_COLUMNS)


def _sealed_run(meta: MetaStore, blobs: BlobStore) -> tuple[RunRecord, list[str]]:
    run = make_run(status="done", finished_at=T0 + timedelta(minutes=1), owner_pid=123)
    meta.create_run(run)
    ids = []
    for a in range(2):
        ro = make_rollout(blobs, run.id, "t", a, reward=0.0, group_id="grp-1")
        meta.save_rollout(ro)
        ids.append(ro.id)
    provenance.finalize_run(meta, run)
    return run, ids


@pytest.mark.parametrize("column", ROLLOUT_COLUMNS)
def test_verify_reports_an_edited_rollout_column(
    meta: MetaStore, blobs: BlobStore, column: str
) -> None:
    run, ids = _sealed_run(meta, blobs)
    other = make_run(status="done")
    meta.create_run(other)
    assert verify_run(meta, blobs, run.id).ok
    value = other.id if column == "run_id" else ROLLOUT_EDITS[column]
    with meta.engine.begin() as conn:
        n = conn.execute(
            text(f"UPDATE rollouts SET {column} = :v WHERE id = :id"), {"v": value, "id": ids[0]}
        ).rowcount
    assert n == 1
    # the row names its run by the run_id column: a moved row is checked under that run
    checked = other.id if column == "run_id" else run.id
    report = verify_run(meta, blobs, checked)
    assert not report.ok
    assert any(ids[0] in p and f"column {column} is" in p for p in report.problems), report.problems
    assert not any(ids[1] in p for p in report.problems)
    if column == "run_id":
        # and the sealed run it left misses it
        left = verify_run(meta, blobs, run.id)
        assert any(ids[0] in p and "missing" in p for p in left.problems), left.problems


@pytest.mark.parametrize("column", sorted(RUN_EDITS))
def test_verify_reports_an_edited_run_column(
    meta: MetaStore, blobs: BlobStore, column: str
) -> None:
    run, _ids = _sealed_run(meta, blobs)
    assert verify_run(meta, blobs, run.id).ok
    with meta.engine.begin() as conn:
        n = conn.execute(
            text(f"UPDATE runs SET {column} = :v WHERE id = :id"),
            {"v": RUN_EDITS[column], "id": run.id},
        ).rowcount
    assert n == 1
    report = verify_run(meta, blobs, run.id)
    assert not report.ok
    assert report.problems == [
        p for p in report.problems if p.startswith(f"run {run.id}: column {column} is")
    ]
    assert len(report.problems) == 1


def test_a_null_reward_column_and_nan_free_round_trip(meta: MetaStore, blobs: BlobStore) -> None:
    # a rollout without a reward stores NULL; verify accepts it, and a forged reward shows
    run = make_run(status="done")
    meta.create_run(run)
    ro = make_rollout(blobs, run.id, reward=None)
    meta.save_rollout(ro)
    assert verify_run(meta, blobs, run.id).ok
    with meta.engine.begin() as conn:
        conn.execute(text("UPDATE rollouts SET reward = 1.0 WHERE id = :id"), {"id": ro.id})
    problems = verify_run(meta, blobs, run.id).problems
    assert problems == [
        f"rollout {ro.id}: column reward is 1.0 in the table but None in the record"
        " (edited in the database)"
    ]
