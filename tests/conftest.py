"""Shared fixtures.

* ``home``: a fresh, empty ``ROLLBOX_HOME`` per test (under pytest's tmp dir).
* ``shared_home``: one home for the whole session, kept between runs in
  ``$ROLLBOX_TEST_HOME`` (default ``/var/tmp/rollbox-test``), so expensive baselines such as
  the default Debian one are bootstrapped once per machine, not once per test.
* Tests marked ``root`` are skipped (with the reason) when not running as root.
* A backend that cannot run skips its tests, or fails them when ``ROLLBOX_REQUIRE_BACKENDS``
  names it (``requirebackends.py``); skipped backends are listed at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from requirebackends import required_backends, summary_lines
from rollbox.config import Home
from rollbox.models import BaselineInfo

SHARED = ("oci", "layers", "baselines", "cache")
"""What a per-test home shares with the session home: the baseline store, not sandboxes."""


def pytest_configure(config: pytest.Config) -> None:
    required_backends()  # a misspelt ROLLBOX_REQUIRE_BACKENDS stops the run at once


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per backend that was skipped (the run did not test it)."""
    lines = summary_lines()
    if lines:
        terminalreporter.section("skipped backends")
        for line in lines:
            terminalreporter.write_line(line, yellow=True)


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


@pytest.fixture(scope="session")
def dev_baseline(shared_home: Home) -> BaselineInfo:
    """The default Debian baseline (python3 included) in the shared home, bootstrapped once per
    machine; nothing outside the repository is read."""
    from rollbox.baselines.store import BaselineStore

    return BaselineStore(shared_home).default()


@pytest.fixture
def linked_home(tmp_path: Path, shared_home: Home, monkeypatch: pytest.MonkeyPatch) -> Home:
    """A fresh home (own tag, own sandboxes) whose baseline store is the shared home's;
    exported as ``ROLLBOX_HOME``."""
    root = tmp_path / "linked-home"
    root.mkdir()
    for name in SHARED:
        (shared_home.root / name).mkdir(exist_ok=True)
        os.symlink(shared_home.root / name, root / name)
    monkeypatch.setenv("ROLLBOX_HOME", str(root))
    return Home(root).ensure()
