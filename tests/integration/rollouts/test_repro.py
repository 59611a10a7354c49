"""`rollbox repro RUN`: same baseline, task copy, agent and seed; outcomes and fs diffs compared."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from rollbox.rollouts.repro import repro_run

from .conftest import Runs

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_repro_matches_deterministic_and_flags_random(runs: Runs) -> None:
    same = runs.task("same", solve="echo fixed > /tmp/out.txt")
    rand = runs.task("rand", solve="head -c 16 /dev/urandom | od -x > /tmp/out.txt")
    run, recs = runs.run([same, rand], agent="oracle")
    assert all(r.status == "done" for r in recs)
    # The task directories are gone: repro works from the stored task copies.
    shutil.rmtree(runs.tasks)
    new_run, items = asyncio.run(repro_run(runs.home, runs.meta, runs.blobs, run.id))
    assert new_run.id != run.id and new_run.summary["repro_of"] == run.id
    by = {i.original.task_name: i for i in items}
    assert by["same"].outcome_match and by["same"].diff_match, by["same"].differences
    assert by["same"].replay is not None
    assert by["same"].replay.seed == by["same"].original.seed
    assert by["same"].replay.baseline_digest == by["same"].original.baseline_digest
    assert by["rand"].outcome_match  # still passes...
    assert not by["rand"].diff_match  # ...but wrote different bytes
    assert any("/tmp/out.txt" in d for d in by["rand"].differences)
    assert new_run.summary["matched"] == 1
