"""Sandbox paths, normalised lexically the same way on every backend."""

from __future__ import annotations

import posixpath

from rollbox.errors import InvalidInputError, PathEscapeError


def normalize(path: str, cwd: str = "/") -> str:
    """``path`` (absolute, or relative to ``cwd``) as a root-relative path ("" for ``/``).

    Raises:
        PathEscapeError: ``..`` climbs above ``/``.
        InvalidInputError: the path is empty or contains a NUL byte.
    """
    if not path or "\0" in path:
        raise InvalidInputError(f"invalid sandbox path {path!r}")
    full = path if path.startswith("/") else posixpath.join(cwd, path)
    parts: list[str] = []
    for comp in full.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise PathEscapeError(f"sandbox path {path!r} escapes the sandbox root")
            parts.pop()
        else:
            parts.append(comp)
    return "/".join(parts)


__all__ = ["normalize"]
