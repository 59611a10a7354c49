"""Output capture: cap, truncation flag, secret masking (also across streamed chunks)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollbox.backends.namespace.capture import StreamCapture, mask


def test_mask_longest_first() -> None:
    assert mask("abc abcdef", ["abc", "abcdef"]) == "*** ***"


def test_cap_and_truncated() -> None:
    c = StreamCapture(5, [], None)
    c.feed(b"abc")
    c.feed(b"defgh")
    assert c.finish() == "abcde" and c.truncated


def test_not_truncated_at_exact_cap() -> None:
    c = StreamCapture(3, [], None)
    c.feed(b"abc")
    assert c.finish() == "abc" and not c.truncated


@given(st.text(min_size=0, max_size=40), st.integers(min_value=1, max_value=7))
def test_secret_split_across_chunks_is_masked(prefix: str, cut: int) -> None:
    secret = "TOPSECRET"
    data = (prefix + secret + "tail").encode()
    got: list[str] = []
    c = StreamCapture(1 << 20, [secret], got.append)
    split = len(prefix.encode()) + cut  # inside the secret
    c.feed(data[:split])
    c.feed(data[split:])
    captured = c.finish()
    assert secret not in "".join(got)
    assert "".join(got) == captured == (prefix + "***tail").replace(secret, "***")


def test_utf8_split_across_chunks() -> None:
    got: list[str] = []
    c = StreamCapture(100, [], got.append)
    raw = "héllo".encode()
    c.feed(raw[:2])
    c.feed(raw[2:])
    assert "".join(got) == "héllo" == c.finish()
