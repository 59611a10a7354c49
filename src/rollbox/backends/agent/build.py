"""Compile rollbox's small C programs once per source hash into ``$ROLLBOX_HOME/bin``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

SOURCE = Path(__file__).with_name("agent.c")


def source_hash(source: Path | Sequence[Path] = SOURCE) -> str:
    """First 8 hex chars of a source file's sha256 (names the cached binary); for a program
    of several files (units and headers), of each one's name, size and bytes in order."""
    if isinstance(source, Path):
        return hashlib.sha256(source.read_bytes()).hexdigest()[:8]
    h = hashlib.sha256()
    for f in source:
        data = f.read_bytes()
        h.update(f"{f.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:8]


def compile_c(home: Home, source: Path | Sequence[Path], name: str, flags: list[str]) -> Path:
    """``gcc FLAGS`` of ``source`` into ``bin/<name>-<hash>[.so]``, reused when present.

    ``source`` is one file, or every file of a program: its ``.c`` units are compiled
    together, its headers only hashed (an edited header rebuilds it).

    Raises:
        BackendUnavailableError: gcc or the static C library is missing, or compiling failed.
    """
    suffix = ".so" if "-shared" in flags else ""
    target = home.root / "bin" / f"{name}-{source_hash(source)}{suffix}"
    if target.exists():
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BackendUnavailableError(
            f"gcc is needed to build {name}", hint="apt-get install gcc libc6-dev"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    files = [source] if isinstance(source, Path) else list(source)
    units = [str(f) for f in files if f.suffix != ".h"]
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    proc = subprocess.run(
        [gcc, *flags, "-o", str(tmp), *units], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BackendUnavailableError(
            f"building {name} failed: {proc.stderr.strip()[-500:]}",
            hint="apt-get install gcc libc6-dev",
        )
    os.replace(tmp, target)  # atomic: concurrent builders race harmlessly
    return target


def agent_binary(home: Home) -> Path:
    """The compiled sandbox agent for the current source (static), built if missing."""
    return compile_c(home, SOURCE, "rollbox-agent", ["-static", "-O2", "-Wall"])
