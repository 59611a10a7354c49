"""Run bookkeeping without sandboxes: resume slots, seeds, repro comparison, options."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.models import FsChange, RolloutRecord, VerifierOutcome
from rollbox.rollouts.repro import compare
from rollbox.rollouts.runs import Run, RunOptions, seed_for
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore


def _task(root: Path, name: str) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "instruction.md").write_text("x\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return d


def _rec(path: Path, attempt: int, status: str, **kw: object) -> RolloutRecord:
    return RolloutRecord(
        id=f"ro-{attempt}-{status}",
        run_id="run-x",
        task_name=path.name,
        task_digest="",
        task_path=str(path.absolute()),
        attempt=attempt,
        agent="nop",
        status=status,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_resume_runs_exactly_the_unfinished_slots(home: Home, tmp_path: Path) -> None:
    a, b = _task(tmp_path, "a"), _task(tmp_path, "b")
    run = Run(
        home,
        MetaStore(None, home=home),
        BlobStore(home),
        RunOptions(task_dirs=[str(a), str(b)], attempts=3),
    )
    existing = [
        _rec(a, 0, "done"),
        _rec(a, 1, "failed"),
        _rec(a, 2, "interrupted"),
        _rec(b, 0, "infra_error", retried_by="ro-later"),  # retried: its retry is missing
        _rec(b, 1, "infra_error"),  # retries exhausted: final
    ]
    slots = list(run._slots(existing))
    got = sorted((Path(s.task_dir).name, s.attempt, s.replaces) for s in slots)
    assert got == [("a", 2, "ro-2-interrupted"), ("b", 0, None), ("b", 2, None)]


def test_slots_interleave_attempts_and_keep_load_errors(home: Home, tmp_path: Path) -> None:
    a = _task(tmp_path, "a")
    bad = _task(tmp_path, "bad")
    (bad / "task.toml").write_text("[agent\n")
    run = Run(
        home,
        MetaStore(None, home=home),
        BlobStore(home),
        RunOptions(task_dirs=[str(a), str(bad)], attempts=2),
    )
    slots = list(run._slots([]))
    assert [(Path(s.task_dir).name, s.attempt) for s in slots] == [
        ("a", 0), ("bad", 0), ("a", 1), ("bad", 1)
    ]  # fmt: skip
    assert slots[1].task is None and "not valid TOML" in (slots[1].error or "")


def test_seeds_are_deterministic_and_distinct() -> None:
    s = seed_for("run-1", "sha256:aa", 0)
    assert s == seed_for("run-1", "sha256:aa", 0)
    assert len({seed_for("run-1", "sha256:aa", i) for i in range(100)}) == 100
    assert seed_for("run-1", "sha256:aa", 0, base=1) != s
    assert 0 <= s < 2**31


def test_compare_outcome_and_diff(tmp_path: Path) -> None:
    p = tmp_path / "t"
    v1 = VerifierOutcome(reward=1.0, passed=True)
    ch = FsChange(path="/a", kind="added", size=1, sha256="sha256:" + "0" * 64)
    a = _rec(p, 0, "done", verifier=v1, fs_diff=[ch])
    b = _rec(p, 0, "done", verifier=v1, fs_diff=[ch]).model_copy(update={"id": "ro-replay"})
    same = compare(a, b)
    assert same.outcome_match and same.diff_match and same.differences == []
    other = ch.model_copy(update={"sha256": "sha256:" + "1" * 64})
    v0 = VerifierOutcome(reward=0.0, passed=False)
    c = _rec(p, 0, "done", verifier=v0, fs_diff=[other]).model_copy(update={"id": "ro-other"})
    diff = compare(a, c)
    assert not diff.outcome_match and not diff.diff_match
    assert "reward: 1.0 -> 0.0" in diff.differences
    # one line per path, old -> new (it was two lines: "only in the original"/"in the replay")
    assert f"fs: /a: added file 1 {ch.sha256} -> added file 1 {other.sha256}" in diff.differences


def test_options_validation() -> None:
    with pytest.raises(InvalidInputError):
        RunOptions(task_dirs=[]).validate()
    opts = RunOptions(task_dirs=["x"], attempts=2, retries=3)
    assert RunOptions.from_args(opts.to_args()) == opts


def test_cleanup_check_counts_only_this_runs_sandboxes(home: Home) -> None:
    import os

    from rollbox.backends.common import network
    from rollbox.hoststate import HostState
    from rollbox.rollouts.runs import _leftovers

    mine, other = "sbx-01aaaaaaaaaaaaaaaaaaaaaaaa", "sbx-01bbbbbbbbbbbbbbbbbbbbbbbb"
    before = HostState()
    after = HostState(
        mounts=frozenset(
            {f"overlay {home.sandboxes}/{mine}/rootfs", f"overlay {home.sandboxes}/{other}/rootfs"}
        ),
        netns=frozenset({network.netns_name(home.tag, mine), network.netns_name(home.tag, other)}),
        processes=frozenset({f"{os.getpid()} python", "999999999 bwrap"}),
    )
    left = _leftovers(before, after, home, {mine})
    assert left == [
        f"mounts: overlay {home.sandboxes}/{mine}/rootfs",
        f"netns: {network.netns_name(home.tag, mine)}",
    ]
    (home.sandboxes / mine).mkdir(parents=True)
    assert f"sandbox_dirs: {mine}" in _leftovers(before, before, home, {mine})
