"""The C guest agent's build: every unit and header in the package is in the build, a
header edit changes the cached binary's name (so it is rebuilt), and one-file programs keep
the names they had."""

from __future__ import annotations

import hashlib
import shutil
import tomllib
from pathlib import Path

from rollbox.backends.agent.build import SOURCE, source_hash
from rollbox.backends.microvm import initramfs

ROOT = Path(__file__).resolve().parents[3]


def test_agent_sources_are_every_guest_agent_unit_and_header() -> None:
    here = initramfs.AGENT_SOURCES[0].parent
    on_disk = {*here.glob("guest_agent*.c"), *here.glob("guest_agent*.h")}
    assert set(initramfs.AGENT_SOURCES) == on_disk
    assert all(f.is_file() for f in initramfs.AGENT_SOURCES)


def test_a_header_edit_changes_the_hash(tmp_path: Path) -> None:
    copies = []
    for f in initramfs.AGENT_SOURCES:
        shutil.copy(f, tmp_path / f.name)
        copies.append(tmp_path / f.name)
    before = source_hash(copies)
    assert before == source_hash(initramfs.AGENT_SOURCES)
    header = next(f for f in copies if f.suffix == ".h")
    header.write_text(header.read_text() + "/* edited */\n")
    assert source_hash(copies) != before
    header.write_text(header.read_text().removesuffix("/* edited */\n"))
    assert source_hash(copies) == before
    # a line moved from one unit to the next (the same bytes overall) is a change too
    a, b = [f for f in copies if f.suffix == ".c"][1:3]
    last = a.read_text().splitlines(keepends=True)[-1]
    a.write_text(a.read_text().removesuffix(last))
    b.write_text(last + b.read_text())
    assert source_hash(copies) != before


def test_one_file_programs_keep_their_hash() -> None:
    assert source_hash(SOURCE) == hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:8]


def test_the_package_ships_the_headers() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["rollbox"]
    assert "**/*.c" in globs and "**/*.h" in globs
