"""Run only by ``test_require_backends.py`` (in a child pytest, with the file named on its
command line): the namespace backend with a corrupted copy of its C agent source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rollbox.backends.agent import build
from rollbox.backends.base import Backend


def test_namespace_with_corrupted_agent(
    backend_or_skip: Callable[[str], Backend], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = build.SOURCE.read_text()
    bad = tmp_path / "agent.c"
    bad.write_text(source[: len(source) // 2])  # cut off mid-file, as a bad merge would
    monkeypatch.setattr(build, "SOURCE", bad)
    backend_or_skip("namespace")
    raise AssertionError("a corrupted agent source was built and the backend prepared")
