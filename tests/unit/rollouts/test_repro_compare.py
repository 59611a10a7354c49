"""One repro comparator: the cases where runs.compare and audit.repro.compare disagreed.

Before the split, ``rollbox repro`` compared (status, reward, passed, verifier error) and
``(path, kind, sha256)`` of the fs diff, while ``rollbox audit --repro`` also compared exit
codes, the error line and each entry's type and size. The stricter one is kept for both.
"""

from __future__ import annotations

from rollbox.audit.repro import compare as audit_compare
from rollbox.models import FsChange, RolloutRecord, VerifierOutcome
from rollbox.rollouts.repro import MAX_FS_LINES, compare, differences

PASS = VerifierOutcome(reward=1.0, passed=True)


def _rec(rid: str, **kw: object) -> RolloutRecord:
    base: dict[str, object] = {
        "status": "done",
        "verifier": PASS,
        "exit_codes": {"agent": 0, "verifier": 0},
    }
    return RolloutRecord(
        id=rid,
        run_id="run-x",
        task_name="t",
        task_digest="",
        task_path="/t",
        attempt=0,
        agent="oracle",
        **{**base, **kw},  # type: ignore[arg-type]
    )


def test_agent_exit_code_differs_with_the_same_reward() -> None:
    # The verifier still passes, but the agent failed this time: not a reproduction.
    orig = _rec("ro-a")
    replay = _rec("ro-b", exit_codes={"agent": 1, "verifier": 0})
    item = compare(orig, replay)
    assert not item.outcome_match and item.diff_match
    assert item.differences == [
        "exit_codes: {'agent': 0, 'verifier': 0} -> {'agent': 1, 'verifier': 0}"
    ]
    assert [d.what for d in audit_compare([orig, replay])] == ["outcome:exit_codes"]


def test_failed_for_another_reason() -> None:
    orig = _rec("ro-a", status="failed", error="agent timed out after 60 s")
    replay = _rec("ro-b", status="failed", error="agent exited 1")
    item = compare(orig, replay)
    assert not item.outcome_match
    assert "error: 'agent timed out after 60 s' -> 'agent exited 1'" in item.differences


def test_same_path_other_type_without_content_hash() -> None:
    # A directory in one, a symlink in the other: neither has a sha256, kind is the same.
    orig = _rec("ro-a", fs_diff=[FsChange(path="/app/out", kind="added", type="dir")])
    replay = _rec("ro-b", fs_diff=[FsChange(path="/app/out", kind="added", type="symlink")])
    item = compare(orig, replay)
    assert item.outcome_match and not item.diff_match
    assert item.differences == ["fs: /app/out: added dir None None -> added symlink None None"]


def test_same_hash_other_size_is_a_difference() -> None:
    sha = "sha256:" + "0" * 64
    orig = _rec("ro-a", fs_diff=[FsChange(path="/f", kind="modified", size=1, sha256=sha)])
    replay = _rec("ro-b", fs_diff=[FsChange(path="/f", kind="modified", size=2, sha256=sha)])
    assert not compare(orig, replay).diff_match


def test_identical_rollouts_match_and_only_named_paths_are_listed() -> None:
    changes = [FsChange(path=f"/p{i:02}", kind="added", size=i) for i in range(30)]
    orig = _rec("ro-a", fs_diff=changes)
    same = compare(orig, _rec("ro-b", fs_diff=changes))
    assert same.outcome_match and same.diff_match and same.differences == []
    other = compare(orig, _rec("ro-c"))  # the replay changed nothing
    assert not other.diff_match
    assert len(other.differences) == MAX_FS_LINES + 1
    assert other.differences[0] == "fs: /p00 (added file 0 None) only in the original"
    assert other.differences[-1] == f"fs: {30 - MAX_FS_LINES} more paths differ"
    assert len(differences([orig, _rec("ro-c")])) == 30
