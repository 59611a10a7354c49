"""The run report: pass@k, quantiles, counting rules, rendering."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from rich.console import Console

from rollbox.rollouts.report import pass_at_k, quantile, quantiles, render, summarize
from rollbox.store.blobs import BlobStore

from .records import T0, make_rollout, make_run


def test_pass_at_k_matches_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - math.comb(2, 2) / math.comb(4, 2))
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_quantiles_interpolate() -> None:
    vals = [float(i) for i in range(1, 101)]
    assert quantile(vals, 0.5) == pytest.approx(50.5)
    assert quantile(vals, 0.99) == pytest.approx(99.01)
    assert quantile([], 0.5) is None
    q = quantiles([3.0, 1.0, 2.0])
    assert (q.n, q.p50, q.max, q.mean) == (3, 2.0, 3.0, 2.0)


def test_summary_counts_final_attempts_and_platform_figures(blobs: BlobStore) -> None:
    run = make_run(status="done", finished_at=T0 + timedelta(seconds=10))
    failed_infra = make_rollout(
        blobs, run.id, "a", 0, status="infra_error", reward=None, seal=False
    )
    retry = make_rollout(blobs, run.id, "a", 0, reward=1.0, retry_of=failed_infra.id)
    failed_infra = failed_infra.model_copy(update={"retried_by": retry.id})
    ros = [
        failed_infra,
        retry,
        make_rollout(blobs, run.id, "a", 1, reward=0.0),
        make_rollout(blobs, run.id, "b", 0, reward=1.0),
        make_rollout(blobs, run.id, "b", 1, reward=None, status="failed", error_kind="verifier"),
    ]
    s = summarize(run, ros, cleanup={"ok": False, "leftovers": ["netns rbx-1"]})
    a, b = s.tasks
    assert (a.task, a.attempts, a.passed, a.pass_rate, a.mean_reward) == ("a", 2, 1, 0.5, 0.5)
    assert a.pass_at_k == {"1": 0.5, "2": 1.0}
    assert (b.attempts, b.passed, b.errors, b.mean_reward) == (2, 1, 1, 1.0)
    p = s.platform
    assert (p.rollouts, p.final_rollouts, p.retries, p.infra_errors) == (5, 4, 1, 1)
    assert p.infra_error_rate == pytest.approx(0.2)
    assert p.completed == 3 and p.completion_rate == pytest.approx(0.75)
    assert p.provisioning_s.n == 5 and p.provisioning_s.p50 == pytest.approx(0.04)
    assert p.queue_s.p99 == pytest.approx(0.02)
    assert p.wall_s == pytest.approx(10.0)
    assert p.cleanup_ok is False and p.cleanup_leftovers == ["netns rbx-1"]
    assert s.overall_pass_rate == pytest.approx(0.5)
    console = Console(width=160, record=True)
    console.print(render(s))
    text = console.export_text()
    for needle in ("provisioning latency", "pass@k", "@2=1.00", "LEFTOVERS", "infra error rate"):
        assert needle in text


def test_empty_run_summarizes(blobs: BlobStore) -> None:
    s = summarize(make_run(), [])
    assert s.tasks == [] and s.overall_pass_rate is None and s.platform.completion_rate == 0.0
    assert s.platform.cleanup_ok is None
