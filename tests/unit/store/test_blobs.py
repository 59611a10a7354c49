"""The content-addressed blob store."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollbox.errors import CorruptionError, InvalidDigestError, StoreError
from rollbox.store.blobs import BlobStore


def test_put_get_layout_and_idempotence(blobs: BlobStore) -> None:
    d = blobs.put(b"hello")
    hx = hashlib.sha256(b"hello").hexdigest()
    assert d == "sha256:" + hx
    assert blobs.path(d) == blobs.root / hx[:2] / hx
    assert blobs.get(d) == b"hello"
    assert blobs.put(b"hello") == d
    assert blobs.has(d) and blobs.verify(d)
    assert oct(blobs.path(d).stat().st_mode & 0o777) == oct(0o444)
    # no staging file left behind
    assert list(blobs.home.tmp.glob("blob-*")) == []


def test_put_file_streams_large_content(blobs: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)
    f = tmp_path / "big"
    f.write_bytes(data)
    ref = blobs.ref_file("big", f)
    assert ref.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert ref.size == len(data)
    assert blobs.get(ref.digest) == data


def test_verify_and_check_detect_change_and_loss(blobs: BlobStore) -> None:
    d = blobs.put(b"some log line\n")
    p = blobs.path(d)
    p.chmod(0o644)
    raw = bytearray(p.read_bytes())
    raw[0] ^= 1
    p.write_bytes(bytes(raw))
    assert not blobs.verify(d)
    with pytest.raises(CorruptionError, match="was modified"):
        blobs.check(d)
    p.unlink()
    assert blobs.hash_of(d) is None
    with pytest.raises(CorruptionError, match="missing"):
        blobs.check(d)
    with pytest.raises(StoreError, match="missing"):
        blobs.get(d)


@pytest.mark.parametrize("bad", ["", "sha256:xyz", "md5:" + "0" * 32, "sha256:" + "A" * 64])
def test_bad_digest_is_invalid_input(blobs: BlobStore, bad: str) -> None:
    with pytest.raises(InvalidDigestError):
        blobs.path(bad)


def test_concurrent_puts_of_same_and_different_content(blobs: BlobStore) -> None:
    payloads = [b"same"] * 20 + [str(i).encode() for i in range(20)]
    with ThreadPoolExecutor(8) as ex:
        digests = list(ex.map(blobs.put, payloads))
    assert len(set(digests)) == 21
    assert all(blobs.verify(d) for d in digests)
    assert list(blobs.home.tmp.glob("blob-*")) == []


def test_put_repairs_a_damaged_copy_and_check_notices_changes(blobs: BlobStore) -> None:
    d = blobs.put(b"payload")
    blobs.check(d)  # fast path: untouched since written
    p = blobs.path(d)
    p.chmod(0o644)
    p.write_bytes(b"pAyload")
    with pytest.raises(CorruptionError, match="modified"):
        blobs.check(d)  # the file changed, so it is re-read
    # a fresh store (another process) re-hashes too
    with pytest.raises(CorruptionError):
        BlobStore(blobs.home).check(d)
    assert blobs.put(b"payload") == d
    assert blobs.get(d) == b"payload" and BlobStore(blobs.home).verify(d)
