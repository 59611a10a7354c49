"""Shared fixtures.

* ``home``: a fresh, empty ``ROLLBOX_HOME`` per test (under pytest's tmp dir).
* ``shared_home``: one home for the whole session, kept between runs in
  ``$ROLLBOX_TEST_HOME`` (default ``/var/tmp/rollbox-test``), so expensive baselines such as
  the default Debian one are bootstrapped once per machine, not once per test.
* Tests marked ``root`` are skipped (with the reason) when not running as root.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.config import Home


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root")
    for item in items:
        if "root" in item.keywords or "vm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Home]:
    """A fresh ROLLBOX_HOME for one test, exported in the environment."""
    root = tmp_path / "home"
    monkeypatch.setenv("ROLLBOX_HOME", str(root))
    yield Home(root).ensure()


@pytest.fixture(scope="session")
def shared_home() -> Home:
    """A ROLLBOX_HOME shared by the whole session and kept between runs (caches)."""
    root = Path(os.environ.get("ROLLBOX_TEST_HOME", "/var/tmp/rollbox-test"))
    return Home(root).ensure()
