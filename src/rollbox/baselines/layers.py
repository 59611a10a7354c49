"""Layer tars and unpacked layer directories.

* :func:`pack_dir` turns a directory into a deterministic, uncompressed OCI layer tar
  (sorted entries, numeric owners, no user/group names). With ``overlay=True`` the
  directory is an overlayfs upper dir and its whiteouts are converted to OCI form:
  a char device 0/0 ``x`` becomes an empty ``.wh.x``; a dir with the xattr
  ``trusted.overlay.opaque=y`` gets an empty ``.wh..wh..opq`` entry inside.
* :func:`unpack_blob` extracts a layer blob (tar, gzip or zstd) with GNU tar and converts
  OCI whiteouts back to overlay form, so the directory can be an overlay lowerdir.
* :func:`file_manifest` records every entry's type, mode, owner and content hash so
  :func:`check_layer` can name a corrupted path later.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import IO, Any

from rollbox.errors import StoreError

WH_PREFIX = ".wh."
WH_OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
_OVERLAY_XATTR_PREFIX = "trusted.overlay."


class HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to ``out``."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


def _xattrs(path: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return out
    for name in sorted(names):
        try:
            out[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return out


def _is_overlay_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _base_info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid = st.st_uid
    info.gid = st.st_gid
    info.uname = ""
    info.gname = ""
    info.mtime = int(st.st_mtime)
    return info


def _empty_file(name: str, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    info.mtime = mtime
    info.uname = ""
    info.gname = ""
    return info


def pack_dir(src: Path, out: IO[bytes], *, overlay: bool = False) -> tuple[str, int]:
    """Write ``src`` as a deterministic layer tar to ``out``.

    Args:
        src: the directory (its contents become the layer; ``src`` itself is not an entry).
        out: binary file to write to.
        overlay: ``src`` is an overlayfs upper dir: convert its whiteouts to OCI form and
            drop overlayfs' private xattrs.

    Returns:
        ``(diff_id, size)`` of the tar written.
    """
    writer = HashingWriter(out)
    links: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        stack = [""]
        while stack:
            rel = stack.pop()
            base = os.path.join(src, rel) if rel else str(src)
            try:
                entries = sorted(os.listdir(base))
            except FileNotFoundError:
                continue
            subdirs: list[str] = []
            for entry in entries:
                name = f"{rel}/{entry}" if rel else entry
                path = os.path.join(base, entry)
                st = os.lstat(path)
                if overlay and _is_overlay_whiteout(st):
                    parent = f"{rel}/" if rel else ""
                    tar.addfile(_empty_file(f"{parent}{WH_PREFIX}{entry}", int(st.st_mtime)))
                    continue
                info = _base_info(name, st)
                xattrs = _xattrs(path)
                opaque = xattrs.get(OPAQUE_XATTR) == b"y"
                if overlay:
                    xattrs = {
                        k: v for k, v in xattrs.items() if not k.startswith(_OVERLAY_XATTR_PREFIX)
                    }
                if xattrs:
                    info.pax_headers = {
                        f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape")
                        for k, v in xattrs.items()
                    }
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    if overlay and opaque:
                        tar.addfile(_empty_file(f"{name}/{WH_OPAQUE}", int(st.st_mtime)))
                    subdirs.append(name)
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if st.st_nlink > 1 and key in links:
                        info.type = tarfile.LNKTYPE
                        info.linkname = links[key]
                        tar.addfile(info)
                        continue
                    if st.st_nlink > 1:
                        links[key] = name
                    info.size = st.st_size
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                elif stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                    info.type = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE
                    info.devmajor = os.major(st.st_rdev)
                    info.devminor = os.minor(st.st_rdev)
                    tar.addfile(info)
                elif stat.S_ISFIFO(st.st_mode):
                    info.type = tarfile.FIFOTYPE
                    tar.addfile(info)
                # sockets cannot be stored in a tar: skipped
            # depth-first, in sorted order
            stack.extend(reversed(subdirs))
    return writer.digest, writer.size


def unpack_blob(blob: Path, dest: Path) -> None:
    """Extract layer ``blob`` into the empty dir ``dest`` and convert OCI whiteouts.

    Raises:
        StoreError: tar failed (corrupt or unsupported blob).
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        "tar",
        "-x",
        "-f",
        str(blob),
        "-C",
        str(dest),
        "--numeric-owner",
        "--same-owner",
        "-p",
        "--xattrs",
        "--xattrs-include=*",
        "--xattrs-exclude=trusted.overlay.*",
        "--no-overwrite-dir",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StoreError(f"cannot unpack layer {blob.name}: {proc.stderr.strip()[-500:]}")
    convert_oci_whiteouts(dest)


def convert_oci_whiteouts(root: Path) -> None:
    """Turn ``.wh.`` files under ``root`` into overlay whiteouts and opaque xattrs."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if d.startswith(WH_PREFIX)]:
            if not name.startswith(WH_PREFIX):
                continue
            path = os.path.join(dirpath, name)
            if os.path.isdir(path) and not os.path.islink(path):
                continue
            os.unlink(path)
            if name == WH_OPAQUE:
                os.setxattr(dirpath, OPAQUE_XATTR, b"y")
            else:
                target = os.path.join(dirpath, name[len(WH_PREFIX) :])
                if os.path.lexists(target):
                    continue
                os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _entry_record(path: str, st: os.stat_result) -> str:
    mode = st.st_mode
    head = f"{stat.S_IFMT(mode):o}:{stat.S_IMODE(mode):o}:{st.st_uid}:{st.st_gid}"
    if stat.S_ISREG(mode):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return f"{head}:{st.st_size}:{h.hexdigest()}"
    if stat.S_ISLNK(mode):
        return f"{head}:->{os.readlink(path)}"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return f"{head}:{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    return head


def file_manifest(root: Path) -> dict[str, str]:
    """``{relative path: record}`` of every entry under ``root`` (type, mode, owner, hash)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            out[rel] = _entry_record(path, os.lstat(path))
    return out


def write_manifest(root: Path, dest: Path) -> None:
    """Compute :func:`file_manifest` of ``root`` and write it as JSON to ``dest``."""
    dest.write_text(json.dumps(file_manifest(root), sort_keys=True, separators=(",", ":")))


def check_layer(root: Path, manifest: Path) -> list[str]:
    """Paths under ``root`` that differ from the recorded manifest (changed/missing/extra)."""
    try:
        recorded: dict[str, str] = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return [f"{manifest} (file manifest missing or unreadable)"]
    if not root.is_dir():
        return [f"{root} (layer directory missing)"]
    bad: list[str] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            seen.add(rel)
            try:
                rec = _entry_record(path, os.lstat(path))
            except OSError:
                bad.append(path)
                continue
            if recorded.get(rel) != rec:
                bad.append(path)
    bad.extend(str(root / rel) + " (missing)" for rel in sorted(set(recorded) - seen))
    return sorted(bad)
