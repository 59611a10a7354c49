"""Import of a rootfs directory or tarball as a one-layer baseline."""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from rollbox.baselines import layers as layerlib
from rollbox.baselines.writer import StoreWriter
from rollbox.errors import InvalidInputError
from rollbox.models import BaselineInfo, ImportSource

_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bzip2",
}


def _compression(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return None


def _decompress(src: Path, dest: Path, kind: str) -> None:
    if kind == "gzip":
        with gzip.open(src, "rb") as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    elif kind == "xz":
        with lzma.open(src, "rb") as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    else:
        tool = {"zstd": "zstd", "bzip2": "bzip2"}[kind]
        with open(dest, "wb") as fout:
            proc = subprocess.run([tool, "-dc", str(src)], stdout=fout, check=False)
        if proc.returncode != 0:
            raise InvalidInputError(f"cannot decompress {src} ({kind})")


def import_rootfs(
    store: StoreWriter, path: Path, *, names: list[str] | None = None
) -> BaselineInfo:
    """Import a rootfs directory (packed deterministically) or a tarball (used as is).

    Raises:
        InvalidInputError: the path is missing, or a file that is not a (compressed) tar.
    """
    path = path.absolute()
    if not path.exists():
        raise InvalidInputError(f"{path} does not exist", hint="give a rootfs directory or tar")
    with store.staging("rootfs") as stage:
        if path.is_dir():
            tar_path = stage / "rootfs.tar"
            with open(tar_path, "wb") as f:
                diff_id, _size = layerlib.pack_dir(path, f)
        elif path.is_file():
            kind = _compression(path)
            if kind is None:
                tar_path = path
            else:
                tar_path = stage / "rootfs.tar"
                _decompress(path, tar_path, kind)
            if not tarfile.is_tarfile(tar_path):
                raise InvalidInputError(
                    f"{path} is not a tar archive", hint="give a rootfs directory or a .tar[.gz]"
                )
            from rollbox.baselines.refs import sha256_file

            diff_id = sha256_file(tar_path)
        else:
            raise InvalidInputError(f"{path} is neither a directory nor a file")
        source = ImportSource(path=os.fspath(path), content_hash=diff_id)
        return store.import_layer_tar(tar_path, source, names=names, created_by=f"import {path}")
