"""Metadata of runs and rollouts in SQLite (default) or PostgreSQL, via SQLAlchemy 2 Core.

Each record is stored whole as its JSON document (``doc``, the source of truth) next to a
few columns for querying. Writes are single statements (an upsert for rollouts), so a
SQLite writer never has to upgrade a read lock, and in-process writers to SQLite are
serialised by a lock; with WAL and a busy timeout, many asyncio tasks (through
``asyncio.to_thread``) and several processes can save at once without "database is locked".
"""

from __future__ import annotations

import asyncio
import fcntl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlalchemy.pool import ConnectionPoolEntry

from rollbox.config import Home
from rollbox.errors import (
    InvalidInputError,
    RolloutNotFoundError,
    RunNotFoundError,
    StoreError,
)
from rollbox.models import RolloutRecord, RunRecord, RunStatus
from rollbox.store import migrations

_md = MetaData()

runs_table = Table(
    "runs",
    _md,
    Column("id", String(64), primary_key=True),
    Column("created_at", String(40), nullable=False),
    Column("finished_at", String(40)),
    Column("status", String(20), nullable=False),
    Column("owner_pid", Integer),
    Column("doc", Text, nullable=False),
)

rollouts_table = Table(
    "rollouts",
    _md,
    Column("id", String(64), primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("task_name", String(512), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("status", String(20), nullable=False),
    Column("created_at", String(40), nullable=False),
    Column("doc", Text, nullable=False),
    Column("task_digest", String(80)),
    Column("group_id", String(64)),
    Column("reward", Float),
    Column("provenance_digest", String(80)),
)

ROLLOUT_COLUMNS = tuple(c.name for c in rollouts_table.columns if c.name != "doc")
"""Every rollout column but ``doc``: each repeats a record field, and ``rollbox verify``
checks each one against the document (a column edited in the database shows)."""

RUN_COLUMNS = tuple(c.name for c in runs_table.columns if c.name != "doc")
"""Every run column but ``doc``, checked against the run document the same way."""


def normalize_url(url: str) -> str:
    """Accept ``postgresql://``/``postgres://`` (use psycopg 3) and ``sqlite:///PATH``.

    Raises:
        InvalidInputError: any other kind of URL.
    """
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if url.startswith(("postgresql+psycopg://", "sqlite:///")):
        return url
    raise InvalidInputError(
        f"unsupported database URL {url!r}",
        hint="use postgresql://USER:PASS@HOST:PORT/DB or sqlite:///PATH",
    )


def _iso(dt: Any) -> str | None:
    return None if dt is None else str(dt.isoformat())


def _rollout_row(r: RolloutRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "run_id": r.run_id,
        "task_name": r.task_name,
        "attempt": r.attempt,
        "status": r.status,
        "created_at": _iso(r.created_at),
        "doc": r.model_dump_json(),
        "task_digest": r.task_digest,
        "group_id": r.group_id,
        "reward": r.verifier.reward if r.verifier else None,
        "provenance_digest": r.provenance_digest,
    }


def rollout_columns(r: RolloutRecord) -> dict[str, Any]:
    """The query columns a rollout record is stored with (what ``verify`` expects to find)."""
    return {k: v for k, v in _rollout_row(r).items() if k != "doc"}


def run_columns(r: RunRecord) -> dict[str, Any]:
    """The query columns a run record is stored with (what ``verify`` expects to find)."""
    return {k: v for k, v in _run_row(r).items() if k != "doc"}


def _run_row(r: RunRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "created_at": _iso(r.created_at),
        "finished_at": _iso(r.finished_at),
        "status": r.status,
        "owner_pid": r.owner_pid,
        "doc": r.model_dump_json(),
    }


@dataclass(frozen=True)
class RawRow:
    """A run or rollout row as stored, unparsed (what ``rollbox verify`` inspects)."""

    columns: dict[str, Any]
    """The query columns."""
    doc: str
    """The stored JSON document."""


class MetaStore:
    """Runs and rollouts in a SQL database.

    Args:
        url: ``postgresql://…`` / ``postgresql+psycopg://…`` / ``sqlite:///PATH``; None means
            SQLite at ``home.db_path``.
        home: The data home (default: ``ROLLBOX_HOME``).

    Raises:
        InvalidInputError: unsupported URL.
        StoreError: the database cannot be reached or is newer than this rollbox.
    """

    def __init__(self, url: str | None = None, home: Home | None = None) -> None:
        if url is None:
            h = home or Home.from_env()
            h.root.mkdir(parents=True, exist_ok=True)
            url = f"sqlite:///{h.db_path}"
        self.url = normalize_url(url)
        try:
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise InvalidInputError(f"invalid database URL {url!r}: {exc}") from None
        self.display_url = parsed.render_as_string(hide_password=True)
        self.dialect = parsed.get_backend_name()
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else None
        self._sqlite_path: Path | None = None
        if self.dialect == "sqlite":
            if not parsed.database:
                raise InvalidInputError("sqlite URL needs a file path: sqlite:///PATH")
            self._sqlite_path = Path(parsed.database)
            self._sqlite_path.parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(
                self.url, connect_args={"timeout": 60, "check_same_thread": False}
            )
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = create_engine(self.url, pool_recycle=1800, pool_size=8, max_overflow=16)
        self._rollout_upsert = self._upsert_stmt(rollouts_table)
        try:
            self._migrate()
        except BaseException:
            self.engine.dispose()
            raise

    # ------------------------------------------------------------------ plumbing

    def __enter__(self) -> MetaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    @contextmanager
    def _begin(self, write: bool = False) -> Iterator[Connection]:
        lock = self._write_lock if write else None
        try:
            if lock is not None:
                lock.acquire()
            try:
                with self.engine.begin() as conn:
                    yield conn
            finally:
                if lock is not None:
                    lock.release()
        except IntegrityError:
            raise
        except DBAPIError as exc:
            # connection refused, "file is not a database", permissions...: one line
            msg = (str(exc.orig) if exc.orig else str(exc)).strip().splitlines()[0]
            raise StoreError(f"database {self.display_url}: {msg}") from None

    def _migrate(self, target: int = migrations.LATEST) -> None:
        if self._sqlite_path is not None:
            lock_path = self._sqlite_path.with_name(self._sqlite_path.name + ".lock")
            with open(lock_path, "a") as lf:
                fcntl.flock(lf, fcntl.LOCK_EX)
                with self._begin(write=True) as conn:
                    migrations.migrate(conn, target)
        else:
            with self._begin(write=True) as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(7202605)"))
                migrations.migrate(conn, target)

    def schema_version(self) -> int:
        """The database's schema version."""
        with self._begin() as conn:
            return migrations.current_version(conn)

    def _upsert_stmt(self, table: Table) -> Any:
        """``INSERT … ON CONFLICT (id) DO UPDATE`` of every column, built once (compiling it
        per call costs more than the SQLite write itself)."""
        ins = (sqlite.insert if self.dialect == "sqlite" else postgresql.insert)(table)
        return ins.on_conflict_do_update(
            index_elements=["id"],
            set_={c.name: ins.excluded[c.name] for c in table.columns if c.name != "id"},
        )

    # ------------------------------------------------------------------ runs

    def create_run(self, run: RunRecord) -> None:
        """Insert a new run.

        Raises:
            StoreError: a run with that id exists already.
        """
        try:
            with self._begin(write=True) as conn:
                conn.execute(runs_table.insert().values(**_run_row(run)))
        except IntegrityError:
            raise StoreError(f"run {run.id} exists already") from None

    def update_run(self, run: RunRecord) -> None:
        """Replace a stored run with ``run``.

        Raises:
            RunNotFoundError: no such run.
        """
        row = _run_row(run)
        with self._begin(write=True) as conn:
            res = conn.execute(runs_table.update().where(runs_table.c.id == run.id).values(**row))
        if res.rowcount == 0:
            raise RunNotFoundError(f"no run {run.id} in {self.display_url}")

    def get_run(self, run_id: str) -> RunRecord:
        """The run with exactly this id.

        Raises:
            RunNotFoundError: no such run.
        """
        with self._begin() as conn:
            doc = conn.execute(select(runs_table.c.doc).where(runs_table.c.id == run_id)).scalar()
        if doc is None:
            raise RunNotFoundError(
                f"no run {run_id} in {self.display_url}", hint="see `rollbox runs ls`"
            )
        return _parse_run(run_id, doc)

    def list_runs(
        self, limit: int | None = None, status: RunStatus | None = None
    ) -> list[RunRecord]:
        """Runs, newest first."""
        q = select(runs_table.c.id, runs_table.c.doc).order_by(runs_table.c.created_at.desc())
        if status is not None:
            q = q.where(runs_table.c.status == status)
        if limit is not None:
            q = q.limit(limit)
        with self._begin() as conn:
            rows = conn.execute(q).all()
        return [_parse_run(rid, doc) for rid, doc in rows]

    def resolve_run(self, ref: str) -> RunRecord:
        """A run by id, unique id prefix (with or without ``run-``), or ``latest``.

        Raises:
            RunNotFoundError: nothing matches.
            InvalidInputError: the prefix matches several runs.
        """
        ref = ref.strip()
        if ref in ("latest", "last"):
            runs = self.list_runs(limit=1)
            if not runs:
                raise RunNotFoundError(f"no runs in {self.display_url}", hint="start one")
            return runs[0]
        if not ref:
            raise InvalidInputError("empty run id", hint="see `rollbox runs ls`")
        rid = self._match_id(runs_table, "run", ref, hint="see `rollbox runs ls`")
        return self.get_run(rid)

    # ------------------------------------------------------------------ rollouts

    def save_rollout(self, rollout: RolloutRecord) -> None:
        """Insert or replace a rollout (safe from many threads and processes at once)."""
        row = _rollout_row(rollout)
        with self._begin(write=True) as conn:
            conn.execute(self._rollout_upsert, row)

    def save_rollouts(self, rollouts: list[RolloutRecord]) -> None:
        """Insert or replace several rollouts in one transaction."""
        if not rollouts:
            return
        rows = [_rollout_row(r) for r in rollouts]
        with self._begin(write=True) as conn:
            conn.execute(self._rollout_upsert, rows)

    async def asave_rollout(self, rollout: RolloutRecord) -> None:
        """``save_rollout`` from asyncio code, off the event loop."""
        await asyncio.to_thread(self.save_rollout, rollout)

    def get_rollout(self, rollout_id: str) -> RolloutRecord:
        """The rollout with exactly this id.

        Raises:
            RolloutNotFoundError: no such rollout.
        """
        with self._begin() as conn:
            doc = conn.execute(
                select(rollouts_table.c.doc).where(rollouts_table.c.id == rollout_id)
            ).scalar()
        if doc is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id} in {self.display_url}")
        return _parse_rollout(rollout_id, doc)

    def resolve_rollout(self, ref: str) -> RolloutRecord:
        """A rollout by id or unique id prefix (with or without ``ro-``).

        Raises:
            RolloutNotFoundError: nothing matches.
            InvalidInputError: the prefix matches several rollouts.
        """
        ref = ref.strip()
        if not ref:
            raise InvalidInputError("empty rollout id")
        rid = self._match_id(rollouts_table, "rollout", ref, hint="see `rollbox report RUN`")
        return self.get_rollout(rid)

    def _match_id(self, table: Table, kind: str, ref: str, hint: str) -> str:
        """The one id of ``table`` equal to ``ref`` or starting with it (``run-``/``ro-`` may
        be left out).

        Raises:
            RunNotFoundError / RolloutNotFoundError: nothing matches.
            InvalidInputError: the prefix matches several ids.
        """
        prefix = "run-" if kind == "run" else "ro-"
        candidates = [ref] if ref.startswith(prefix) else [ref, prefix + ref]
        ids: list[str] = []
        with self._begin() as conn:
            for c in candidates:
                query = select(table.c.id).where(table.c.id.like(_like_prefix(c), escape="\\"))
                ids += conn.execute(query.limit(3)).scalars().all()
        ids = sorted(set(ids))
        if ref in ids:
            return ref
        if not ids:
            missing = RunNotFoundError if kind == "run" else RolloutNotFoundError
            raise missing(f"no {kind} matches {ref!r} in {self.display_url}", hint=hint)
        if len(ids) > 1:
            raise InvalidInputError(
                f"{kind} prefix {ref!r} is ambiguous ({', '.join(ids)}...)",
                hint="give more characters",
            )
        return ids[0]

    def rollouts_of(self, run_id: str) -> list[RolloutRecord]:
        """Every rollout of a run, ordered by task, attempt and creation time."""
        return [_parse_rollout(r.columns["id"], r.doc) for r in self.raw_rollouts_of(run_id)]

    def raw_run(self, run_id: str) -> RawRow | None:
        """The run row as stored, unparsed (None if there is none)."""
        cols = [runs_table.c[name] for name in RUN_COLUMNS]
        with self._begin() as conn:
            row = conn.execute(
                select(*cols, runs_table.c.doc).where(runs_table.c.id == run_id)
            ).first()
        if row is None:
            return None
        return RawRow(columns=dict(zip(RUN_COLUMNS, row[:-1], strict=True)), doc=row[-1])

    def raw_rollouts_of(self, run_id: str) -> list[RawRow]:
        """Rows of a run's rollouts without parsing (for integrity checks)."""
        cols = [rollouts_table.c[name] for name in ROLLOUT_COLUMNS]
        q = (
            select(*cols, rollouts_table.c.doc)
            .where(rollouts_table.c.run_id == run_id)
            .order_by(
                rollouts_table.c.task_name, rollouts_table.c.attempt, rollouts_table.c.created_at
            )
        )
        with self._begin() as conn:
            rows = conn.execute(q).all()
        return [
            RawRow(columns=dict(zip(ROLLOUT_COLUMNS, row[:-1], strict=True)), doc=row[-1])
            for row in rows
        ]

    def rollout_ids(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` are stored."""
        if not ids:
            return set()
        with self._begin() as conn:
            found = conn.execute(
                select(rollouts_table.c.id).where(rollouts_table.c.id.in_(ids))
            ).scalars()
            return set(found)

    def count_rollouts(self, run_id: str) -> dict[str, int]:
        """Number of a run's rollouts per status."""
        from sqlalchemy import func

        q = (
            select(rollouts_table.c.status, func.count())
            .where(rollouts_table.c.run_id == run_id)
            .group_by(rollouts_table.c.status)
        )
        with self._begin() as conn:
            return {str(s): int(n) for s, n in conn.execute(q).all()}


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern (escape char ``\\``) matching strings that start with ``prefix``."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _sqlite_pragmas(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()


def _parse_run(run_id: str, doc: str) -> RunRecord:
    try:
        return RunRecord.model_validate_json(doc)
    except ValidationError as exc:
        raise StoreError(f"stored run {run_id} is unreadable: {exc.errors()[0]['msg']}") from None


def _parse_rollout(rollout_id: str, doc: str) -> RolloutRecord:
    try:
        return RolloutRecord.model_validate_json(doc)
    except ValidationError as exc:
        raise StoreError(
            f"stored rollout {rollout_id} is unreadable: {exc.errors()[0]['msg']}",
            hint="run `rollbox verify` on its run",
        ) from None


__all__ = [
    "ROLLOUT_COLUMNS",
    "RUN_COLUMNS",
    "MetaStore",
    "RawRow",
    "normalize_url",
    "rollout_columns",
    "rollouts_table",
    "run_columns",
    "runs_table",
]
