"""The file-copy contract for symlinks, shared by every backend.

* A path inside a sandbox resolves with chroot semantics: an absolute link target starts
  at the sandbox's root, ``..`` stops at that root. Nothing resolves to a host path.
* A tree download keeps a link as a link only when its target (resolved lexically as
  above) lies inside the copied tree; the host link is then written relative, so it can
  never point outside the destination tree. A link pointing out of the tree is refused
  (``"refuse"``, the default) or replaced by what it points to (``"content"``).
"""

from __future__ import annotations

import posixpath
from typing import Literal

LinkPolicy = Literal["refuse", "content"]
"""What a tree download does with a symlink pointing out of the copied tree."""
LINK_POLICIES: tuple[str, ...] = ("refuse", "content")


def resolve_lexically(link: str, target: str) -> str:
    """Where the link at sandbox path ``link`` with text ``target`` points, as an absolute
    sandbox path (chroot semantics: absolute from the sandbox root, ``..`` clamped there)."""
    base = "/" if target.startswith("/") else posixpath.dirname("/" + link.lstrip("/"))
    parts: list[str] = []
    for comp in posixpath.join(base, target).split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if parts:
                parts.pop()
        else:
            parts.append(comp)
    return "/" + "/".join(parts)


def inside(path: str, top: str) -> bool:
    """``path`` is ``top`` or below it (both absolute, normalised)."""
    top = top.rstrip("/") or "/"
    return path == top or path.startswith(top + "/") or top == "/"


def in_tree_text(link: str, target: str, top: str) -> str | None:
    """The relative text for a host copy of the link at ``link`` (inside the copied tree
    ``top``), or None when its target points out of the tree."""
    dest = resolve_lexically(link, target)
    if not inside(dest, top):
        return None
    return posixpath.relpath(dest, posixpath.dirname("/" + link.lstrip("/")))
