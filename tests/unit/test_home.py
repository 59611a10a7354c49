"""ROLLBOX_HOME that cannot be a directory: one line, exit 2, for every command that opens
the data home (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.errors import InvalidInputError


def test_home_that_is_a_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv("ROLLBOX_HOME", str(f))
    with pytest.raises(InvalidInputError, match=r"ROLLBOX_HOME=.*/file is not a directory"):
        Home.from_env()
    monkeypatch.setenv("ROLLBOX_HOME", str(f / "below"))
    with pytest.raises(InvalidInputError, match=r"below: .*/file is not a directory"):
        Home.from_env()
    with pytest.raises(InvalidInputError, match="not a directory"):
        Home(f).ensure()


def test_home_that_does_not_exist_yet_is_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLBOX_HOME", str(tmp_path / "a" / "b"))
    home = Home.from_env().ensure()
    assert home.tmp.is_dir() and home.locks.is_dir()


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "ls"],
        ["sandbox", "ls"],
        ["baseline", "ls"],
        ["run", "."],
        ["cleanup"],
        ["verify", "latest"],
        ["runs", "ls", "--json"],
    ],
)
def test_cli_with_a_file_as_home_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "ROLLBOX_HOME": str(f)},
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    if "--json" in argv:
        assert proc.stderr == "" and '"exit_code": 2' in proc.stdout
    else:
        assert proc.stderr.count("\n") == 1 and "is not a directory" in proc.stderr
    assert f.read_text() == "x"
