"""Versioned schema migrations of the metadata database (SQLite and PostgreSQL).

The database records its version in ``schema_version`` (one row per applied migration).
Opening a database applies every migration above its version, in order, under a lock
(``pg_advisory_xact_lock`` on PostgreSQL, an ``flock`` on a sidecar file for SQLite), so
concurrent openers never migrate twice. Each migration is idempotent (it checks before it
adds) because SQLite runs DDL outside the surrounding transaction.

Versions:

1. ``runs(id, created_at, finished_at, status, owner_pid, doc)`` and
   ``rollouts(id, run_id, task_name, attempt, status, created_at, doc)``; ``doc`` holds the
   full JSON record, the other columns are for querying.
2. ``rollouts`` gains ``task_digest``, ``group_id``, ``reward``, ``provenance_digest``
   (back-filled from ``doc``) and an index on ``(run_id, task_name)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, inspect, text

from rollbox.errors import StoreError

LATEST = 2
"""The schema version this rollbox writes."""


def _columns(conn: Connection, table: str) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns(table)}


def _indexes(conn: Connection, table: str) -> set[str]:
    return {str(i["name"]) for i in inspect(conn).get_indexes(table)}


def _v1(conn: Connection) -> None:
    tables = set(inspect(conn).get_table_names())
    if "runs" not in tables:
        conn.execute(
            text(
                "CREATE TABLE runs ("
                " id VARCHAR(64) PRIMARY KEY,"
                " created_at VARCHAR(40) NOT NULL,"
                " finished_at VARCHAR(40),"
                " status VARCHAR(20) NOT NULL,"
                " owner_pid INTEGER,"
                " doc TEXT NOT NULL)"
            )
        )
    if "rollouts" not in tables:
        conn.execute(
            text(
                "CREATE TABLE rollouts ("
                " id VARCHAR(64) PRIMARY KEY,"
                " run_id VARCHAR(64) NOT NULL,"
                " task_name VARCHAR(512) NOT NULL,"
                " attempt INTEGER NOT NULL,"
                " status VARCHAR(20) NOT NULL,"
                " created_at VARCHAR(40) NOT NULL,"
                " doc TEXT NOT NULL)"
            )
        )
    if "ix_rollouts_run_id" not in _indexes(conn, "rollouts"):
        conn.execute(text("CREATE INDEX ix_rollouts_run_id ON rollouts (run_id)"))


def _v2(conn: Connection) -> None:
    have = _columns(conn, "rollouts")
    for name, sqltype in (
        ("task_digest", "VARCHAR(80)"),
        ("group_id", "VARCHAR(64)"),
        ("reward", "DOUBLE PRECISION"),
        ("provenance_digest", "VARCHAR(80)"),
    ):
        if name not in have:
            conn.execute(text(f"ALTER TABLE rollouts ADD COLUMN {name} {sqltype}"))
    if "ix_rollouts_run_task" not in _indexes(conn, "rollouts"):
        conn.execute(text("CREATE INDEX ix_rollouts_run_task ON rollouts (run_id, task_name)"))
    # Back-fill the new columns from the stored documents.
    rows = conn.execute(text("SELECT id, doc FROM rollouts WHERE task_digest IS NULL")).all()
    for rid, doc in rows:
        try:
            d: dict[str, Any] = json.loads(doc)
        except ValueError:
            continue  # left for `rollbox verify` to report
        verifier = d.get("verifier") or {}
        conn.execute(
            text(
                "UPDATE rollouts SET task_digest = :td, group_id = :g, reward = :r,"
                " provenance_digest = :p WHERE id = :id"
            ),
            {
                "td": d.get("task_digest"),
                "g": d.get("group_id"),
                "r": verifier.get("reward"),
                "p": d.get("provenance_digest"),
                "id": rid,
            },
        )


MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [(1, _v1), (2, _v2)]
"""(version, function) in order."""


def current_version(conn: Connection) -> int:
    """The highest applied version, 0 for an empty database."""
    if not inspect(conn).has_table("schema_version"):
        return 0
    v = conn.execute(text("SELECT MAX(version) FROM schema_version")).scalar()
    return int(v or 0)


def migrate(conn: Connection, target: int = LATEST) -> list[int]:
    """Apply every migration above the database's version up to ``target``.

    Args:
        conn: A connection inside a transaction, holding the migration lock.
        target: Version to stop at (tests create old databases with it).

    Returns:
        The versions applied.

    Raises:
        StoreError: the database is newer than this rollbox understands.
    """
    if not inspect(conn).has_table("schema_version"):
        conn.execute(
            text(
                "CREATE TABLE schema_version ("
                " version INTEGER PRIMARY KEY, applied_at VARCHAR(40) NOT NULL)"
            )
        )
    have = current_version(conn)
    if have > LATEST:
        raise StoreError(
            f"database schema version {have} is newer than this rollbox understands ({LATEST})",
            hint="upgrade rollbox",
        )
    applied = []
    for version, fn in MIGRATIONS:
        if have < version <= target:
            fn(conn)
            conn.execute(
                text("INSERT INTO schema_version (version, applied_at) VALUES (:v, :at)"),
                {"v": version, "at": datetime.now(UTC).isoformat()},
            )
            applied.append(version)
    return applied
