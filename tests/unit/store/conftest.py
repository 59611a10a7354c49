"""Fixtures of the store unit tests: a blob store and a SQLite MetaStore in a fresh home."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox.config import Home
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore


@pytest.fixture
def blobs(home: Home) -> BlobStore:
    return BlobStore(home)


@pytest.fixture
def meta(home: Home) -> Iterator[MetaStore]:
    with MetaStore(home=home) as m:
        yield m
