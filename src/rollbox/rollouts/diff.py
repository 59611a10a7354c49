"""Filesystem diff of a sandbox against its baseline.

The overlay backends keep a sandbox's writes in an overlayfs *upper* directory on the host,
so the diff is a walk of that directory compared with the baseline's read-only layer
directories, never a scan of the whole root:

* an upper entry absent from every lower layer → ``added``;
* an upper regular file / symlink present below → ``modified`` (copy-up);
* an overlay whiteout (char device 0/0) → ``deleted``;
* an opaque directory (``trusted.overlay.opaque=y``) → everything below it in the lower layers
  that the upper does not have is ``deleted``.

A snapshot's top layer (unpacked by the baseline store in the same overlay form) is diffed the
same way, which is how backends without a host-side upper (microVMs) get their diff.

Entries the backend itself writes when a sandbox starts (mount points, ``/etc/hostname``...) are
taken as *noise* right after provisioning (:func:`signature`) and left out when unchanged, and
rollbox's own uploads (``/task``, ``/tests``, ``/solution``, ``/logs/verifier``) are excluded.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from rollbox.models import FsChange

EXCLUDE = ("/task", "/tests", "/solution", "/logs/verifier", "/run/rollbox", "/proc", "/sys")
"""Paths (and everything below them) that rollbox itself puts into a sandbox."""

_OPAQUE = "trusted.overlay.opaque"


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(path: str) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _excluded(path: str, exclude: tuple[str, ...]) -> bool:
    return any(path == e or path.startswith(e + "/") for e in exclude)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _type(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "other"


def _lower_lstat(rel: str, lowers_top_first: list[Path]) -> os.stat_result | None:
    """The entry for ``rel`` as the lower layers show it (None: absent or whited out)."""
    for layer in lowers_top_first:
        p = os.path.join(layer, rel)
        try:
            st = os.lstat(p)
        except OSError:
            # An opaque parent in this layer hides everything below it.
            parent = os.path.dirname(rel)
            while parent:
                if _is_opaque(os.path.join(layer, parent)):
                    return None
                parent = os.path.dirname(parent)
            continue
        if _is_whiteout(st):
            return None
        return st
    return None


def signature(upper: Path) -> dict[str, tuple[int, int, int]]:
    """``path -> (mode, size, mtime_ns)`` of every entry in ``upper`` (for noise filtering)."""
    out: dict[str, tuple[int, int, int]] = {}
    if not upper.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(upper):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rel = "/" + os.path.relpath(full, upper)
            out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def diff_upper(
    upper: Path,
    lowers: list[Path],
    *,
    exclude: tuple[str, ...] = EXCLUDE,
    noise: dict[str, tuple[int, int, int]] | None = None,
) -> list[FsChange]:
    """Changes recorded in an overlay upper dir against lower layer dirs.

    Args:
        upper: the overlayfs upper directory (or a snapshot's top layer directory).
        lowers: the baseline's layer directories, bottom first (``BaselineStore.layer_dirs``).
        exclude: absolute paths (with everything below) to leave out.
        noise: a :func:`signature` taken when the sandbox started; entries still identical
            to it are left out.

    Returns:
        Changes sorted by path.
    """
    tops = list(reversed(lowers))
    noise = noise or {}
    out: list[FsChange] = []
    if not upper.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(upper):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, upper)
        rel_dir = "" if rel_dir == "." else rel_dir
        if rel_dir and _is_opaque(dirpath):
            present = set(dirnames) | set(filenames)
            for layer in tops:
                lower_dir = os.path.join(layer, rel_dir)
                if not os.path.isdir(lower_dir) or os.path.islink(lower_dir):
                    continue
                for dp, dn, fn in os.walk(lower_dir):
                    for name in dn + fn:
                        full = os.path.join(dp, name)
                        sub = os.path.relpath(full, lower_dir)
                        if sub.split("/", 1)[0] in present:
                            continue
                        st = os.lstat(full)
                        if _is_whiteout(st):
                            continue
                        path = "/" + os.path.join(rel_dir, sub)
                        if not _excluded(path, exclude):
                            out.append(FsChange(path=path, kind="deleted", type=_type(st)))  # type: ignore[arg-type]
                break
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.join(rel_dir, name)
            path = "/" + rel
            if _excluded(path, exclude):
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if noise.get(path) == (st.st_mode, st.st_size, st.st_mtime_ns):
                continue
            below = _lower_lstat(rel, tops)
            if _is_whiteout(st):
                if below is not None:
                    out.append(FsChange(path=path, kind="deleted", type=_type(below)))  # type: ignore[arg-type]
                continue
            kind = "added" if below is None else "modified"
            if kind == "modified" and stat.S_ISDIR(st.st_mode):
                continue  # a copied-up directory: its children tell what changed
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
            digest = None
            if stat.S_ISREG(st.st_mode):
                try:
                    digest = _sha256(full)
                except OSError:
                    digest = None
            elif stat.S_ISLNK(st.st_mode):
                digest = "sha256:" + hashlib.sha256(os.readlink(full).encode()).hexdigest()
            out.append(
                FsChange(path=path, kind=kind, size=size, sha256=digest, type=_type(st))  # type: ignore[arg-type]
            )
    out.sort(key=lambda c: c.path)
    return out


def upper_dir_of(info_extra: dict[str, object], sandbox_dir: Path) -> Path | None:
    """The host-side overlay upper dir of a sandbox, when its backend has one."""
    for key in ("upper", "upper_dir", "upperdir"):
        value = info_extra.get(key)
        if isinstance(value, str) and Path(value).is_dir():
            return Path(value)
    candidate = sandbox_dir / "upperfs" / "upper"
    return candidate if candidate.is_dir() else None
