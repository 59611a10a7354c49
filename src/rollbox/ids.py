"""Identifiers: ``<prefix>-<ulid>`` (time-ordered, 26 Crockford base32 chars, lower case)."""

from __future__ import annotations

import os
import re
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def ulid() -> str:
    """A new ULID: 48 bits of milliseconds then 80 random bits, lower-case base32."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """``prefix-<ulid>``, e.g. ``sbx-01j…``."""
    return f"{prefix}-{ulid()}"


_ID_RE = re.compile(r"^(sbx|ro|run|snap)-[0-9a-hjkmnp-tv-z]{26}$")


def is_id(text: str, prefix: str) -> bool:
    """True when ``text`` is a well-formed id with that prefix."""
    return bool(_ID_RE.match(text)) and text.startswith(prefix + "-")
