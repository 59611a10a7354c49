"""The same runner on gVisor and on microVMs: separate verifier, fs diff, no leftovers."""

from __future__ import annotations

import pytest

from rollbox.store.provenance import check

from .conftest import Runs


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gvisor", pytest.param("microvm", marks=pytest.mark.vm)])
def test_separate_verifier_and_diff_on(runs: Runs, backend: str) -> None:
    t = runs.task(
        "sep-" + backend,
        toml='[verifier]\nenvironment_mode = "separate"\n',
        solve="echo 42 > /tmp/answer; rm -f /etc/motd",
        test='[ "$(cat /tmp/answer)" = 42 ] && echo 1 > /logs/verifier/reward.txt',
    )
    run, recs = runs.run([t], agent="oracle", backend_override=backend)
    (rec,) = recs
    assert rec.status == "done", rec.error
    assert rec.backend == backend and rec.backend_version
    assert rec.verifier is not None and rec.verifier.passed and rec.verifier.mode == "separate"
    assert len(rec.sandbox_ids) == 2
    changes = {(c.path, c.kind) for c in rec.fs_diff}
    assert ("/tmp/answer", "added") in changes and ("/etc/motd", "deleted") in changes
    assert check(rec, runs.blobs) == []
    assert run.summary["cleanup"]["ok"] is True, run.summary["cleanup"]
    for sid in rec.sandbox_ids:
        assert not (runs.home.sandboxes / sid).exists()
