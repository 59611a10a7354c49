"""Parsing of baseline references: digests, digest prefixes and image names."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from rollbox.errors import InvalidDigestError

HEX_RE = re.compile(r"^[0-9a-f]+$")
MIN_PREFIX = 8
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


def sha256_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """``sha256:<hex>`` of a file's contents."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def hex_of(digest: str) -> str:
    """The hex part of a full ``sha256:<64 hex>`` digest.

    Raises:
        InvalidDigestError: not a full sha256 digest.
    """
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or not HEX_RE.match(hexpart):
        raise InvalidDigestError(
            f"malformed digest {digest!r}", hint="expected sha256:<64 lower-case hex digits>"
        )
    return hexpart


def looks_like_digest(ref: str) -> bool:
    """True when ``ref`` is meant as a digest or prefix (``sha256:…`` or >= 8 hex chars)."""
    if ref.startswith("sha256:"):
        return True
    return len(ref) >= MIN_PREFIX and bool(HEX_RE.match(ref))


def digest_prefix(ref: str) -> str:
    """The lower-case hex prefix a digest reference names.

    Raises:
        InvalidDigestError: not hex, too short (< 8) or too long (> 64).
    """
    hexpart = ref[len("sha256:") :] if ref.startswith("sha256:") else ref
    if not hexpart or not HEX_RE.match(hexpart) or len(hexpart) > 64:
        raise InvalidDigestError(
            f"malformed digest {ref!r}",
            hint="expected sha256:<hex> or a unique prefix of at least 8 lower-case hex digits",
        )
    if len(hexpart) < MIN_PREFIX:
        raise InvalidDigestError(
            f"digest prefix {ref!r} is too short",
            hint=f"give at least {MIN_PREFIX} hex digits",
        )
    return hexpart


def normalize_name(name: str) -> str:
    """Canonical form of an image name, as Docker resolves short names.

    ``debian:bookworm`` → ``docker.io/library/debian:bookworm``; no tag → ``:latest``.
    Names without a registry part other than Docker Hub's are kept as given (plus tag).
    """
    name = name.strip()
    if "@" in name:
        return name
    first, sep, _rest = name.partition("/")
    has_registry = bool(sep) and ("." in first or ":" in first or first == "localhost")
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        name = name + ":latest"
    if has_registry:
        return name
    if "/" not in name:
        return "docker.io/library/" + name
    return "docker.io/" + name


def check_name(name: str) -> str:
    """Validate a user-given baseline name (tag).

    Raises:
        InvalidDigestError: never; names that look like digests are refused below.
        rollbox.errors.InvalidInputError: the name has characters an image name cannot have.
    """
    from rollbox.errors import InvalidInputError

    if not _NAME_RE.match(name) or len(name) > 255:
        raise InvalidInputError(
            f"invalid baseline name {name!r}",
            hint="use letters, digits and . _ / : - like an image name, e.g. myimage:1",
        )
    if looks_like_digest(name):
        raise InvalidInputError(
            f"baseline name {name!r} looks like a digest", hint="pick a name that is not hex"
        )
    return name
