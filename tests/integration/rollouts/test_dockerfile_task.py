"""A task's environment/Dockerfile is built through the baseline store, never skipped.

Before, a fallback in rollouts/runs.py could answer "this rollbox cannot build
environment/Dockerfile yet"; the build is now always the store's buildah build, and a build
that cannot happen fails the rollout with buildah's own reason.
"""

from __future__ import annotations

import pytest

from .conftest import Runs

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _with_dockerfile(runs: Runs, name: str, dockerfile: str, **kw: str) -> None:
    d = runs.task(name, **kw)
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text(dockerfile)


def test_dockerfile_task_is_built_and_used(runs: Runs) -> None:
    _with_dockerfile(
        runs,
        "built",
        "FROM debian:bookworm\nRUN echo from-the-dockerfile > /built.txt\n",
        solve="cp /built.txt /tmp/out.txt",
        test='[ "$(cat /tmp/out.txt)" = from-the-dockerfile ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt",
    )
    _with_dockerfile(runs, "unbuildable", "FROM rollbox-test-no-such-image:1\nRUN true\n")
    run, recs = runs.run([runs.tasks / "built", runs.tasks / "unbuildable"], agent="oracle")
    assert run.status == "done" and run.summary["cleanup"]["ok"], run.summary["cleanup"]
    by = {r.task_name: r for r in recs}
    ok = by["built"]
    assert ok.status == "done" and ok.verifier is not None and ok.verifier.reward == 1.0, ok.error
    from rollbox.baselines.store import BaselineStore

    default = BaselineStore(runs.home).default().digest
    assert ok.baseline_digest and ok.baseline_digest != default  # the built image, not the default
    bad = by["unbuildable"]
    assert bad.status == "failed" and bad.error is not None
    assert bad.error.startswith("baseline: ") and "rollbox-test-no-such-image" in bad.error
    assert "cannot build" not in bad.error
