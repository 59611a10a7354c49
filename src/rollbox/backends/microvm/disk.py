"""Guest disks: one read-only ext4 image per baseline digest, one writable disk per sandbox.

* ``vm/disks/<digest-hex>.ext4``: the baseline's merged layers (``mkfs.ext4 -d`` from a
  read-only overlay of the unpacked layers, so whiteouts are honoured), built once, cached,
  mode 0444, attached ``readonly=on`` to every VM of that baseline (serial ``rbxbase``).
* ``vm/disks/upper-<MB>M.ext4``: an empty ext4 of the disk limit's size holding ``upper/``
  and ``work/`` for the guest's overlayfs, built once per size.
* per sandbox: a qcow2 copy-on-write file on top of the size template (serial ``rbxupper``):
  the guest's overlay upper dir, i.e. exactly the sandbox's changes, capped by its size.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendError, BackendUnavailableError


def _run(cmd: list[str]) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        pkg = {"mkfs.ext4": "e2fsprogs", "qemu-img": "qemu-utils"}.get(cmd[0], cmd[0])
        raise BackendUnavailableError(
            f"{cmd[0]} is not installed", hint=f"apt-get install {pkg}"
        ) from None
    if proc.returncode != 0:
        raise BackendError(f"{' '.join(cmd[:3])}... failed: {proc.stderr.strip()[-400:]}")


def cached_build(path: Path, build: Callable[[Path], object]) -> Path:
    """``path``, built once by ``build(tmp)`` into a temporary name and renamed into place
    under ``<dir>/.lock`` (concurrent callers wait and reuse it; a crash leaves no half file).
    """
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            build(tmp)
            os.rename(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += max(st.st_blocks * 512, 4096)
    return total


@contextmanager
def merged_view(layers: list[Path], scratch: Path) -> Iterator[Path]:
    """The merged root of ``layers`` (bottom first): a read-only overlay mount (or the one
    layer itself), unmounted on exit."""
    if len(layers) == 1:
        yield layers[0]
        return
    mnt = Path(tempfile.mkdtemp(prefix="merge-", dir=scratch))
    lower = ":".join(str(p) for p in reversed(layers))
    try:
        _run(["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lower}", str(mnt)])
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
    finally:
        os.rmdir(mnt)


def ensure_base_image(home: Home, digest: str, layers: list[Path]) -> Path:
    """The cached ext4 image of baseline ``digest``, built from its layers on first use.

    Raises:
        BackendError: the image could not be built.
    """

    def build(tmp: Path) -> None:
        home.tmp.mkdir(parents=True, exist_ok=True)
        with merged_view(layers, home.tmp) as root:
            size_mb = _tree_bytes(root) * 12 // 10 // (1 << 20) + 64
            _run(
                ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-L", "rbxbase", "-m", "0",
                 "-E", "lazy_itable_init=1", "-d", str(root), str(tmp), f"{size_mb}M"]
            )  # fmt: skip
        os.chmod(tmp, 0o444)

    return cached_build(home.vm / "disks" / (digest.removeprefix("sha256:") + ".ext4"), build)


def ensure_upper_template(home: Home, size_mb: int) -> Path:
    """An empty ext4 of ``size_mb`` MiB with ``upper/``, ``work/`` (cached per size)."""
    d = home.vm / "disks"

    def build(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(dir=d) as tree:
            for sub in ("upper", "work"):
                os.mkdir(os.path.join(tree, sub), 0o755)
            _run(
                ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-L", "rbxupper", "-m", "0",
                 "-d", tree, str(tmp), f"{size_mb}M"]
            )  # fmt: skip
        os.chmod(tmp, 0o444)

    return cached_build(d / f"upper-{size_mb}M.ext4", build)


def create_overlay(
    path: Path, backing: Path, backing_format: str, *, size_mb: int | None = None
) -> None:
    """A qcow2 at ``path`` whose unwritten blocks read from ``backing``.

    With ``size_mb`` the backing file is not opened (``-u``): it may be in use by a
    running QEMU that holds its lock.
    """
    cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=65536",
           "-b", str(backing), "-F", backing_format]  # fmt: skip
    if size_mb is not None:
        cmd += ["-u", str(path), f"{size_mb}M"]
    else:
        cmd.append(str(path))
    _run(cmd)
