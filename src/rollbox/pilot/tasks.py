"""Harbor task workloads for the pilot: one level = one ``rollbox run`` of the task.

The rollouts go through the rollout runner (``rollbox.rollouts.runs.Run``, the ``oracle``
agent, the level's concurrency, the pilot's retries), so what is measured is exactly what a
run does. Per-rollout figures come from the phase timestamps in each record:
queue = ``queued`` → ``provisioning``; provisioning = ``provisioning`` → the next phase
(the sandbox is up and usable).
"""

from __future__ import annotations

import time
from datetime import datetime

from rollbox.models import PhaseStamp, RolloutRecord
from rollbox.pilot.models import PilotConfig, RolloutSample


def _at(phases: list[PhaseStamp], name: str) -> datetime | None:
    for p in phases:
        if p.phase == name:
            return p.at
    return None


def _after(phases: list[PhaseStamp], name: str) -> datetime | None:
    for i, p in enumerate(phases):
        if p.phase == name and i + 1 < len(phases):
            return phases[i + 1].at
    return None


def sample_of(index: int, rec: RolloutRecord, attempts: int, errors: list[str]) -> RolloutSample:
    """A pilot sample from a final rollout record."""
    q = _at(rec.phases, "queued")
    p = _at(rec.phases, "provisioning")
    p_end = _after(rec.phases, "provisioning") if rec.status != "infra_error" else None
    end = rec.finished_at or (rec.phases[-1].at if rec.phases else None)
    status = (
        "completed"
        if rec.status == "done" and rec.verifier is not None and rec.verifier.passed
        else "infra_error"
        if rec.status == "infra_error"
        else "failed"
    )
    return RolloutSample(
        index=index,
        status=status,  # type: ignore[arg-type]
        attempts=attempts,
        queue_s=(p - q).total_seconds() if p and q else 0.0,
        provision_s=(p_end - p).total_seconds() if p and p_end else None,
        total_s=(end - q).total_seconds() if end and q else 0.0,
        errors=errors,
    )


async def run_task_level(
    cfg: PilotConfig, backend: str, concurrency: int, created: set[str]
) -> tuple[list[RolloutSample], float]:
    """Run the task ``cfg.rollouts`` times at ``concurrency``; samples and wall time.

    The ids of the sandboxes the rollouts used are added to ``created``.
    """
    import asyncio

    from rollbox.rollouts.baseline import resolve_baseline
    from rollbox.rollouts.runs import Run, RunOptions
    from rollbox.rollouts.tasks import load_task
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

    assert cfg.workload.task_dir is not None
    run = Run(
        cfg.home,
        MetaStore(home=cfg.home),
        BlobStore(cfg.home),
        RunOptions(
            task_dirs=[str(cfg.workload.task_dir)],
            agent="oracle",
            attempts=cfg.rollouts,
            concurrency=concurrency,
            backend=backend,
            retries=cfg.retries,
        ),
        check_host=False,
    )
    run.start_new()
    # build/resolve the task's baseline first: preparation, not part of the level's timing
    await asyncio.to_thread(resolve_baseline, load_task(cfg.workload.task_dir), cfg.home)
    t0 = time.perf_counter()
    result = await run.execute()
    wall = time.perf_counter() - t0
    by_id = {r.id: r for r in result.rollouts}
    for r in result.rollouts:
        created.update(r.sandbox_ids)
    samples: list[RolloutSample] = []
    for rec in result.rollouts:
        if rec.retry_of is not None:
            continue  # counted with the first attempt it retries
        chain = [rec]
        while chain[-1].retried_by and chain[-1].retried_by in by_id:
            chain.append(by_id[chain[-1].retried_by])
        errors = [
            f"{r.error_kind or 'infra'}: {r.error}" for r in chain if r.status == "infra_error"
        ]
        final = chain[-1]
        s = sample_of(len(samples), final, len(chain), errors)
        first_q = _at(rec.phases, "queued")
        if first_q is not None and final.finished_at is not None:
            s = s.model_copy(update={"total_s": (final.finished_at - first_q).total_seconds()})
        samples.append(s)
    return samples, wall
