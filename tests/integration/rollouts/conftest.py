"""Fixtures for real runs on the namespace backend.

Baselines come from the session-wide ``shared_home`` (the default Debian baseline is
bootstrapped once per machine); every test gets its own SQLite metadata store, so records of
one test never mix with another's.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.hoststate import HostState
from rollbox.models import RolloutRecord, RunRecord
from rollbox.rollouts.runs import Run, RunOptions
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore


def write_task(
    root: Path,
    name: str,
    *,
    solve: str = "echo done > /tmp/out.txt",
    test: str = "if [ -f /tmp/out.txt ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt",
    toml: str = "",
) -> Path:
    """A Harbor task on the default baseline (no environment/ dir: no build needed)."""
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(f"Task {name}.\n")
    (d / "task.toml").write_text(textwrap.dedent(toml))
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test) + "\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + textwrap.dedent(solve) + "\n")
    return d


@dataclass
class Runs:
    home: Home
    meta: MetaStore
    blobs: BlobStore
    db_url: str
    tasks: Path

    def run(
        self, dirs: list[Path], backend_override: str = "namespace", **kw: object
    ) -> tuple[RunRecord, list[RolloutRecord]]:
        opts = RunOptions(task_dirs=[str(d) for d in dirs], backend=backend_override, **kw)  # type: ignore[arg-type]
        r = Run(self.home, self.meta, self.blobs, opts)
        r.start_new()
        result = asyncio.run(r.execute())
        return result.run, self.meta.rollouts_of(result.run.id)

    def task(self, name: str, **kw: str) -> Path:
        return write_task(self.tasks, name, **kw)


@pytest.fixture
def runs(shared_home: Home, tmp_path: Path) -> Runs:
    from rollbox.baselines.store import BaselineStore

    BaselineStore(shared_home).default()
    url = f"sqlite:///{tmp_path / 'rollbox.db'}"
    meta = MetaStore(url, home=shared_home)
    return Runs(shared_home, meta, BlobStore(shared_home), url, tmp_path / "tasks")


@pytest.fixture
def no_leaks(shared_home: Home) -> Callable[[list[RolloutRecord]], dict[str, list[str]]]:
    """Call it at the end of a test with the run's records: what their sandboxes left on the
    host (mounts, cgroups, sandbox dirs, processes naming them). Other engineers' sandboxes
    share this host and home, so only resources naming these sandboxes count."""
    before = HostState.capture(shared_home.sandboxes)

    def check(records: list[RolloutRecord]) -> dict[str, list[str]]:
        ids = {s for r in records for s in r.sandbox_ids}
        assert ids, "the records name no sandboxes"
        after = HostState.capture(shared_home.sandboxes)
        out: dict[str, list[str]] = {}
        for kind, items in before.diff(after).items():
            mine = [i for i in items if any(x in i for x in ids)]
            if mine:
                out[kind] = mine
        for sid in ids:
            if (shared_home.sandboxes / sid).exists():
                out.setdefault("sandbox_dirs", []).append(sid)
        return out

    return check
