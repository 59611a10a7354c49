"""Blame and retry decisions for sandbox limits (rollouts/blame.py), and the reasons' place in
the provenance digest and ``rollbox verify``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from rollbox.config import Home
from rollbox.errors import (
    BackendError,
    PathEscapeError,
    SandboxCrashedError,
    SandboxExhaustedError,
    SandboxExpiredError,
    SandboxStateError,
)
from rollbox.models import Limits, RolloutRecord
from rollbox.rollouts import blame
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore
from rollbox.store.verify import verify_run

from ..store.records import make_rollout, make_run


@pytest.fixture
def blobs(home: Home) -> BlobStore:
    return BlobStore(home)


@pytest.fixture
def meta(home: Home) -> Iterator[MetaStore]:
    with MetaStore(home=home) as m:
        yield m


def _rec(**kw: object) -> RolloutRecord:
    return RolloutRecord(
        id="ro-x",
        run_id="run-x",
        task_name="t",
        task_digest="sha256:" + "0" * 64,
        agent="oracle",
        limits=Limits(memory_mb=64, pids=32, disk_mb=16),
        **kw,  # type: ignore[arg-type]
    )


def test_without_reasons_the_old_rules_hold() -> None:
    rec = _rec()
    assert blame.classify(rec, SandboxCrashedError("gone"), "agent")[:2] == ("infra_error", "infra")
    assert blame.classify(rec, PathEscapeError("out"), "verify")[:2] == ("failed", "task")
    status, kind, msg = blame.classify(rec, KeyError("k"), "verify")
    assert (status, kind) == ("failed", "infra") and msg.startswith("internal error: KeyError")
    assert blame.verifier_error(rec, "no reward") == ("verifier", "no reward")
    assert rec.reasons == []


def test_an_exhausted_sandbox_in_the_agent_phase_is_the_agents() -> None:
    rec = _rec(status="infra_error")
    exc = SandboxExhaustedError("gVisor reached its host task limit", reason="pids_exhausted")
    status, kind, msg = blame.classify(rec, exc, "agent")
    assert (status, kind) == ("failed", "agent")
    assert "process limit (pids=32)" in msg and "host task limit" in msg
    assert rec.reasons == ["pids_exhausted"] and rec.reason_phases == {"pids_exhausted": "agent"}


def test_later_failures_after_an_agent_limit_are_the_agents() -> None:
    rec = _rec()
    blame.note(rec, ["oom_killed"], "agent")
    # gVisor: the hog took the sandbox down, the verifier's upload then fails
    status, kind, msg = blame.classify(rec, SandboxStateError("sandbox is crashed"), "verify")
    assert (status, kind) == ("failed", "agent")
    assert msg.startswith("the agent was OOM-killed at its memory limit (memory_mb=64); then:")
    # a full disk leaves no room for the tests: not the task's
    rec = _rec()
    blame.note(rec, ["disk_full"], "agent")
    assert blame.classify(rec, PathEscapeError("no space"), "verify")[1] == "agent"
    kind, msg = blame.verifier_error(rec, "no reward file")
    assert kind == "agent" and "disk (disk_mb=16)" in msg and msg.endswith("no reward file")
    assert blame.agent_failure(rec, "agent timed out after 5s").endswith("(disk_mb=16))")


def test_limits_in_the_verify_phase_and_ttl_outside_the_agent() -> None:
    rec = _rec()
    exc = SandboxExhaustedError("died", reason="oom_killed")
    assert blame.classify(rec, exc, "verify")[:2] == ("failed", "verifier")
    assert rec.reason_phases == {"oom_killed": "verify"} and not blame.agent_reasons(rec)
    # the TTL outside the agent phase: rollbox's own time, retried
    rec = _rec()
    expired = SandboxExpiredError("sandbox sbx-1 reached its TTL of 30 s")
    assert blame.classify(rec, expired, "collect")[:2] == ("infra_error", "infra")
    rec.status = "infra_error"
    assert blame.retryable(rec)
    # ... and inside it, the agent's
    rec = _rec()
    status, kind, msg = blame.classify(rec, expired, "agent")
    assert (status, kind) == ("failed", "agent") and "TTL of 30 s" in msg


def test_retryable_only_for_infra_without_agent_limits() -> None:
    assert blame.retryable(_rec(status="infra_error"))
    assert not blame.retryable(_rec(status="failed"))
    rec = _rec(status="infra_error")
    blame.note(rec, ["disk_full"], "agent")
    assert not blame.retryable(rec)
    assert not isinstance(BackendError("x").reason, str)


def test_note_keeps_the_first_phase_and_a_fixed_order() -> None:
    rec = _rec()
    blame.note(rec, ["disk_full", "oom_killed", "bogus"], "agent")
    blame.note(rec, ["oom_killed", "ttl_expired"], "verify")
    assert rec.reasons == ["oom_killed", "disk_full", "ttl_expired"]
    assert rec.reason_phases == {
        "oom_killed": "agent",
        "disk_full": "agent",
        "ttl_expired": "verify",
    }


def test_reasons_are_sealed_and_an_edit_is_caught(blobs: BlobStore, meta: MetaStore) -> None:
    run = make_run()
    rec = make_rollout(blobs, run.id, reasons=["oom_killed"], reason_phases={"oom_killed": "agent"})
    assert provenance.check(rec, blobs) == []
    forged = rec.model_copy(update={"reasons": [], "reason_phases": {}})
    assert any("tampered" in p for p in provenance.check(forged, blobs))
    # in the database: the document edited behind rollbox's back
    meta.create_run(run)
    meta.save_rollout(rec)
    assert verify_run(meta, blobs, run.id).problems == []
    table = sa.table("rollouts", sa.column("id"), sa.column("doc"))
    doc = rec.model_dump_json().replace('"reasons":["oom_killed"]', '"reasons":[]')
    assert '"reasons":[]' in doc
    with meta.engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.id == rec.id).values(doc=doc))
    problems = verify_run(meta, blobs, run.id).problems
    assert any(rec.id in p and "tampered" in p for p in problems), problems


@pytest.mark.parametrize("reason", ["oom_killed", "pids_exhausted", "disk_full", "ttl_expired"])
def test_limit_text_names_the_limit(reason: str) -> None:
    text = blame.limit_text(reason, Limits(memory_mb=64, pids=32, disk_mb=16))
    assert text and reason not in text
