"""Store fixtures over both databases: SQLite (a file in the test's home) and PostgreSQL.

PostgreSQL tests use a fresh database created for the session on the server named by
``ROLLBOX_TEST_PG_URL`` (``make test`` starts it with scripts/ci-services.sh) and dropped at
the end. When the variable is unset they are skipped; when it is set but the server cannot be
reached they FAIL.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from rollbox.config import Home
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore, normalize_url


def _base_url() -> str | None:
    return os.environ.get("ROLLBOX_TEST_PG_URL") or None


@contextmanager
def fresh_pg_database(base: str) -> Iterator[str]:
    """Create a uniquely named database, yield its URL, drop it afterwards."""
    url = make_url(normalize_url(base))
    name = f"rollbox_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.fail(f"PostgreSQL at {url.render_as_string()} is unreachable: {exc.orig}")
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    base = _base_url()
    if base is None:
        pytest.skip("ROLLBOX_TEST_PG_URL is unset (make test starts PostgreSQL and sets it)")
    with fresh_pg_database(base) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, home: Home) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{home.db_path}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def meta(db_url: str, home: Home) -> Iterator[MetaStore]:
    with MetaStore(db_url, home=home) as m:
        yield m


@pytest.fixture
def blobs(home: Home) -> BlobStore:
    return BlobStore(home)
