"""MetaStore against SQLite and a real PostgreSQL server: records, migrations, concurrency,
tamper detection."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, inspect, text

from rollbox.config import Home
from rollbox.errors import (
    InvalidInputError,
    RolloutNotFoundError,
    RunNotFoundError,
    StoreError,
)
from rollbox.models import RunRecord, VerifierOutcome, utcnow
from rollbox.store import migrations, provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore, normalize_url
from rollbox.store.verify import verify_run
from unit.store.records import make_rollout, make_run

from .conftest import fresh_pg_database


def test_runs_round_trip_update_and_resolve(meta: MetaStore) -> None:
    tok = secrets.token_hex(4)
    a = make_run(id=f"run-{tok}a1")
    b = make_run(id=f"run-{tok}b2", created_at=utcnow() + timedelta(days=1))
    meta.create_run(a)
    meta.create_run(b)
    with pytest.raises(StoreError, match="exists already"):
        meta.create_run(a)
    assert meta.get_run(a.id) == a
    done = a.model_copy(update={"status": "done", "finished_at": utcnow(), "summary": {"x": 1}})
    meta.update_run(done)
    assert meta.get_run(a.id) == done
    assert meta.resolve_run(f"{tok}a").id == a.id
    assert meta.resolve_run(a.id).id == a.id
    assert meta.resolve_run("latest").id == b.id
    with pytest.raises(InvalidInputError, match="ambiguous"):
        meta.resolve_run(f"run-{tok}")
    with pytest.raises(RunNotFoundError):
        meta.resolve_run(f"run-{tok}zz")
    with pytest.raises(RunNotFoundError):
        meta.get_run("run-missing")
    with pytest.raises(RunNotFoundError):
        meta.update_run(make_run(id="run-missing"))
    ids = [r.id for r in meta.list_runs(status="done")]
    assert a.id in ids and b.id not in ids
    # "%" and "_" in a prefix are literal, not wildcards
    with pytest.raises(RunNotFoundError):
        meta.resolve_run(f"run-{tok}%")


def test_rollouts_upsert_order_and_lookup(meta: MetaStore, blobs: BlobStore) -> None:
    run = make_run()
    meta.create_run(run)
    ros = [make_rollout(blobs, run.id, t, a) for t in ("b", "a") for a in (1, 0)]
    for r in ros:
        meta.save_rollout(r)
    got = meta.rollouts_of(run.id)
    assert [(r.task_name, r.attempt) for r in got] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    changed = ros[0].model_copy(
        update={"verifier": VerifierOutcome(reward=0.25, passed=True), "status": "done"}
    )
    changed = provenance.seal(changed, blobs)
    meta.save_rollout(changed)
    assert meta.get_rollout(changed.id) == changed
    assert len(meta.rollouts_of(run.id)) == 4
    assert meta.resolve_rollout(changed.id[3:14]).id == changed.id
    assert meta.count_rollouts(run.id) == {"done": 4}
    batch = [r.model_copy(update={"status": "failed"}) for r in got]
    meta.save_rollouts(batch)
    meta.save_rollouts([])
    assert meta.count_rollouts(run.id) == {"failed": 4}
    with pytest.raises(RolloutNotFoundError):
        meta.get_rollout("ro-missing")
    with pytest.raises(RolloutNotFoundError):
        meta.resolve_rollout("ro-missing")


def test_fifty_concurrent_async_saves(meta: MetaStore, blobs: BlobStore) -> None:
    run = make_run()
    meta.create_run(run)
    ros = [make_rollout(blobs, run.id, f"t{i % 5}", i, seal=False) for i in range(50)]

    async def one(i: int) -> None:
        rec = ros[i]
        # each rollout is saved at several phases, as the runner does
        for status in ("queued", "running", "done"):
            rec = rec.model_copy(update={"status": status})
            await meta.asave_rollout(rec)
            await asyncio.sleep(0)
        await asyncio.to_thread(meta.rollouts_of, run.id)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(50)))

    asyncio.run(main())
    assert meta.count_rollouts(run.id) == {"done": 50}


WRITER = """
import sys
from rollbox.config import Home
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore
from unit.store.records import make_rollout
url, run_id, tag = sys.argv[1:4]
home = Home.from_env()
m = MetaStore(url, home=home)
b = BlobStore(home)
for i in range(25):
    m.save_rollout(make_rollout(b, run_id, tag, i))
"""


@pytest.mark.slow
def test_several_processes_write_at_once(meta: MetaStore, db_url: str, home: Home) -> None:
    run = make_run()
    meta.create_run(run)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, db_url, run.id, f"p{i}"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert meta.count_rollouts(run.id) == {"done": 100}


def test_migrates_a_version_1_database(db_url: str, home: Home, blobs: BlobStore) -> None:
    url = db_url
    if url.startswith("postgresql"):
        ctx = fresh_pg_database(url)
        url = ctx.__enter__()
    else:
        ctx = None
        url = f"sqlite:///{home.root / 'old.db'}"
    try:
        engine = create_engine(normalize_url(url))
        run = make_run()
        rec = make_rollout(blobs, run.id, reward=0.5)
        with engine.begin() as conn:
            assert migrations.migrate(conn, target=1) == [1]
            conn.execute(
                text(
                    "INSERT INTO runs (id, created_at, status, doc)"
                    " VALUES (:id, :c, :s, :doc)"
                ),
                {"id": run.id, "c": run.created_at.isoformat(), "s": run.status,
                 "doc": run.model_dump_json()},
            )  # fmt: skip
            conn.execute(
                text(
                    "INSERT INTO rollouts (id, run_id, task_name, attempt, status, created_at, doc)"
                    " VALUES (:id, :r, :t, :a, :s, :c, :doc)"
                ),
                {"id": rec.id, "r": run.id, "t": rec.task_name, "a": rec.attempt,
                 "s": rec.status, "c": rec.created_at.isoformat(), "doc": rec.model_dump_json()},
            )  # fmt: skip
            assert migrations.current_version(conn) == 1
            cols = {c["name"] for c in inspect(conn).get_columns("rollouts")}
            assert "reward" not in cols
        engine.dispose()
        with MetaStore(url, home=home) as m:
            assert m.schema_version() == migrations.LATEST == 2
            assert m.get_rollout(rec.id) == rec
            with m.engine.connect() as conn:
                row = conn.execute(
                    text("SELECT reward, task_digest, provenance_digest FROM rollouts")
                ).one()
            assert tuple(row) == (0.5, rec.task_digest, rec.provenance_digest)
            # re-opening does not migrate again
            with MetaStore(url, home=home) as again:
                assert again.schema_version() == 2
            report = verify_run(m, blobs, run.id)
            assert report.problems == [] and report.rollouts_checked == 1
            with m.engine.begin() as conn:
                conn.execute(text("INSERT INTO schema_version VALUES (99, 'future')"))
        with pytest.raises(StoreError, match="newer than this rollbox"):
            MetaStore(url, home=home)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


def test_verify_detects_edits_made_with_sql(meta: MetaStore, blobs: BlobStore) -> None:
    run = make_run(status="done")
    meta.create_run(run)
    ros = [make_rollout(blobs, run.id, "t", a, reward=0.0) for a in range(3)]
    for r in ros:
        meta.save_rollout(r)
    sealed_run = provenance.finalize_run(meta, run)
    assert verify_run(meta, blobs, run.id).ok
    doc = json.loads(ros[0].model_dump_json())
    doc["verifier"]["reward"] = 1.0
    with meta.engine.begin() as conn:
        conn.execute(
            text("UPDATE rollouts SET doc = :d WHERE id = :id"),
            {"d": json.dumps(doc), "id": ros[0].id},
        )
        conn.execute(text("DELETE FROM rollouts WHERE id = :id"), {"id": ros[1].id})
        forged = sealed_run.model_copy(update={"agent": "nop"})
        conn.execute(
            text("UPDATE runs SET doc = :d WHERE id = :id"),
            {"d": forged.model_dump_json(), "id": run.id},
        )
    report = verify_run(meta, blobs, run.id)
    assert not report.ok
    assert any(ros[0].id in p and "tampered" in p for p in report.problems)
    assert any(ros[1].id in p and "missing" in p for p in report.problems)
    assert any(f"run {run.id}" in p and "tampered" in p for p in report.problems)
    assert not any(ros[2].id in p for p in report.problems)


def test_cli_verify_with_db_url(meta: MetaStore, db_url: str, blobs: BlobStore) -> None:
    run = make_run(status="done")
    meta.create_run(run)
    meta.save_rollout(make_rollout(blobs, run.id))
    provenance.finalize_run(meta, run)
    res = subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", "verify", run.id, "--db", db_url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["ok"] is True


def test_unreachable_server_is_a_store_error(home: Home) -> None:
    with pytest.raises(StoreError, match=r"127\.0\.0\.1"):
        MetaStore("postgresql://rollbox:rollbox@127.0.0.1:1/none", home=home)


def test_run_record_status_is_validated() -> None:
    with pytest.raises(ValueError):
        RunRecord(id="run-x", status="weird")  # type: ignore[arg-type]


def test_odd_content_round_trips_and_still_verifies(meta: MetaStore, blobs: BlobStore) -> None:
    run = make_run()
    meta.create_run(run)
    rec = make_rollout(
        blobs,
        run.id,
        'задача-✓ "quoted" \\ back',
        verifier=VerifierOutcome(reward=0.1 + 0.2, rewards={"a": 1e-300, "ü": -0.0}),
        extra={"nan": float("nan"), "bytes": b"\x00raw", "tuple": (1, 2), "nested": {"z": [None]}},
        env_names=["A", "Ω"],
    )
    meta.save_rollout(rec)
    back = meta.get_rollout(rec.id)
    assert back.task_name == rec.task_name and back.verifier is not None
    assert back.verifier.reward == 0.1 + 0.2
    assert provenance.check(back, blobs) == []
    with pytest.raises(ValueError):
        VerifierOutcome(reward=float("inf"))


KILLED_WRITER = """
import sys
from rollbox.config import Home
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore
from unit.store.records import make_rollout
url, run_id = sys.argv[1:3]
home = Home.from_env()
m = MetaStore(url, home=home)
b = BlobStore(home)
i = 0
while True:
    m.save_rollout(make_rollout(b, run_id, "k", i, extra={"big": "x" * 20000}))
    i += 1
    if i == 5:
        print("ready", flush=True)
"""


@pytest.mark.slow
def test_sigkilled_writer_leaves_intact_records(
    meta: MetaStore, db_url: str, blobs: BlobStore
) -> None:
    run = make_run()
    meta.create_run(run)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, db_url, run.id],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait(timeout=30)
    raws = meta.raw_rollouts_of(run.id)
    assert len(raws) >= 5
    report = verify_run(meta, blobs, run.id)
    assert report.problems == [], report.problems
    assert report.rollouts_checked == len(raws)
    # the store stays writable after the crash
    meta.save_rollout(make_rollout(blobs, run.id, "after", 0))
    assert len(meta.rollouts_of(run.id)) == len(raws) + 1
