"""Bad task.toml numbers in a real run (namespace backend): each is the task's failure with a
message naming the field, never an infrastructure error (``1e308`` once became "internal
error: OverflowError" and was retried); a disk the host cannot hold is refused before a
sandbox starts."""

from __future__ import annotations

import pytest

from rollbox.backends.common.hostlimits import tmpfs_capacity_mb

from .conftest import Runs

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_bad_numbers_fail_the_task_naming_the_field(runs: Runs) -> None:
    huge_disk = tmpfs_capacity_mb() + 1024
    cases = {
        "t-agent-1e308": ("[agent]\ntimeout_sec = 1e308\n", "[agent] timeout_sec"),
        "t-verifier-inf": ("[verifier]\ntimeout_sec = inf\n", "[verifier] timeout_sec"),
        "t-memory-nan": ("[environment]\nmemory = nan\n", "[environment] memory"),
        "t-cpus-inf": ("[environment]\ncpus = inf\n", "[environment] cpus"),
        "t-storage-host": (f"[environment]\nstorage_mb = {huge_disk}\n", f"disk_mb={huge_disk}"),
    }
    dirs = [runs.task(name, toml=toml) for name, (toml, _) in cases.items()]
    run, records = runs.run(dirs, retries=2)
    assert run.status == "done"
    by_task = {r.task_name: r for r in records}
    assert set(by_task) == set(cases)  # one record each: nothing was retried
    for name, (_, needle) in cases.items():
        rec = by_task[name]
        assert rec.status == "failed", (name, rec.status, rec.error)
        assert rec.error_kind == "task", (name, rec.error_kind, rec.error)
        assert rec.error is not None and needle in rec.error, (name, rec.error)
        assert "internal error" not in rec.error
        assert rec.sandbox_ids == []  # refused before any sandbox existed
