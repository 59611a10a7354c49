"""Allow-list networking refuses up front, naming the packages, when its host tools are
missing (it used to become None on an ImportError and fail later)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.backends.common.overlay_backend import ALLOW_TOOLS, require_allow_tools
from rollbox.errors import BackendUnavailableError


def _path_with(tmp_path: Path, tools: list[str]) -> str:
    for t in tools:
        exe = tmp_path / t
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return str(tmp_path)


def test_all_tools_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, list(ALLOW_TOOLS)))
    require_allow_tools()


def test_missing_tools_named_with_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["ip"]))
    with pytest.raises(BackendUnavailableError) as exc:
        require_allow_tools()
    assert "iptables, iptables-restore" in str(exc.value)
    assert exc.value.hint == "apt-get install iptables"
