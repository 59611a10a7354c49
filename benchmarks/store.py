"""Metadata store: saving a full rollout record, side by side with the raw driver.

Raw: one ``INSERT ... ON CONFLICT DO UPDATE`` of the same JSON document through the plain
driver (``sqlite3`` with the same WAL pragmas / ``psycopg``), autocommit per statement.
rollbox: ``MetaStore.save_rollout`` (SQLAlchemy Core upsert of the document plus query
columns, one transaction). Also timed: ``provenance.seal`` (canonical JSON + re-hash of the
record's blobs), ``verify_run`` per rollout, and N rollouts saved from N asyncio tasks at
once. Runs alternate raw/rollbox so both see the same machine load.

Usage: ``python benchmarks/store.py [-n N]``; PostgreSQL too when ``ROLLBOX_TEST_PG_URL`` is
set (``scripts/ci-services.sh`` prints it). Writes benchmarks/results/store.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _stats import stats_ms  # benchmarks/_stats.py (scripts run from benchmarks/)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rollbox.config import Home
from rollbox.models import RolloutRecord
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore, normalize_url
from rollbox.store.verify import verify_run
from unit.store.records import make_rollout, make_run

RESULTS = Path(__file__).with_name("results") / "store.json"

UPSERT = (
    "INSERT INTO raw_rollouts (id, run_id, doc) VALUES ({p}, {p}, {p}) "
    "ON CONFLICT (id) DO UPDATE SET run_id = excluded.run_id, doc = excluded.doc"
)


def stats(xs: list[float]) -> dict[str, float]:
    """Median, p99 (nearest rank) and mean in milliseconds."""
    return stats_ms(xs, 3)


def side_by_side(raw: list[float], ours: list[float]) -> dict[str, Any]:
    r, o = stats(raw), stats(ours)
    return {"raw": r, "rollbox": o, "ratio_p50": round(o["p50_ms"] / r["p50_ms"], 2)}


def bench_db(
    url: str, home: Home, blobs: BlobStore, n: int, raw_conn: Any, p: str
) -> dict[str, Any]:
    meta = MetaStore(url, home=home)
    run = make_run()
    meta.create_run(run)
    records = [make_rollout(blobs, run.id, f"t{i % 10}", i) for i in range(n)]
    cur = raw_conn.cursor()
    cur.execute(
        "CREATE TABLE IF NOT EXISTS raw_rollouts (id VARCHAR(64) PRIMARY KEY,"
        " run_id VARCHAR(64), doc TEXT)"
    )
    sql = UPSERT.format(p=p)
    raw_t: list[float] = []
    ours_t: list[float] = []
    for rec in records:
        t0 = time.perf_counter()
        cur.execute(sql, (rec.id, rec.run_id, rec.model_dump_json()))
        raw_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        meta.save_rollout(rec)
        ours_t.append(time.perf_counter() - t0)

    async def burst(recs: list[RolloutRecord]) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(meta.asave_rollout(r) for r in recs))
        return time.perf_counter() - t0

    burst_recs = [r.model_copy(update={"status": "done"}) for r in records[:50]]
    burst_s = asyncio.run(burst(burst_recs))
    t0 = time.perf_counter()
    report = verify_run(meta, blobs, run.id)
    verify_s = time.perf_counter() - t0
    assert report.rollouts_checked == n
    meta.close()
    return {
        "save_rollout": side_by_side(raw_t, ours_t),
        "concurrent_50_saves_s": round(burst_s, 4),
        "concurrent_saves_per_s": round(50 / burst_s, 1),
        "verify_ms_per_rollout": round(verify_s / n * 1000, 3),
        "record_bytes": len(records[0].model_dump_json()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()
    out: dict[str, Any] = {
        "benchmark": "store",
        "host": platform.node(),
        "python": platform.python_version(),
        "n": args.n,
    }
    with tempfile.TemporaryDirectory(prefix="rbx-store-bench-") as tmp:
        home = Home(Path(tmp) / "home").ensure()
        blobs = BlobStore(home)
        run = make_run()
        recs = [make_rollout(blobs, run.id, seal=False) for _ in range(min(args.n, 200))]
        seal_t = []
        for r in recs:
            t0 = time.perf_counter()
            provenance.seal(r, blobs)
            seal_t.append(time.perf_counter() - t0)
        out["seal"] = stats(seal_t)

        raw_path = Path(tmp) / "raw.db"
        raw = sqlite3.connect(raw_path, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=60000"):
            raw.execute(f"PRAGMA {pragma}")
        out["sqlite"] = bench_db(f"sqlite:///{home.db_path}", home, blobs, args.n, raw, "?")
        raw.close()

        pg = os.environ.get("ROLLBOX_TEST_PG_URL")
        if pg:
            import psycopg
            from sqlalchemy import create_engine, text
            from sqlalchemy.engine import make_url

            url = make_url(normalize_url(pg))
            name = f"rollbox_bench_{os.getpid()}"
            admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            try:
                db_url = url.set(database=name)
                conninfo = db_url.set(drivername="postgresql").render_as_string(hide_password=False)
                with psycopg.connect(conninfo, autocommit=True) as rc:
                    out["postgresql"] = bench_db(
                        db_url.render_as_string(hide_password=False), home, blobs, args.n, rc, "%s"
                    )
            finally:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
