"""``rollbox repro``: re-run a run's rollouts from their records and compare the outcomes."""

from __future__ import annotations

import asyncio
import os
import socket
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox import __version__
from rollbox.config import Home
from rollbox.errors import RollboxError, TaskError
from rollbox.ids import new_id
from rollbox.models import RolloutRecord, RunRecord, utcnow
from rollbox.rollouts.agents import parse_agent
from rollbox.rollouts.runner import RolloutPlan, RolloutRunner
from rollbox.rollouts.runs import RunEvents, executor_for
from rollbox.rollouts.scheduler import run_pool
from rollbox.rollouts.tasks import load_task
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore


def extract_task(blobs: BlobStore, rec: RolloutRecord, dest_root: Path) -> Path:
    """Unpack the stored copy of a rollout's task into ``dest_root/<digest hex>``."""
    if rec.task_blob is None:
        raise TaskError(f"rollout {rec.id} has no stored task copy")
    dest = dest_root / rec.task_digest.removeprefix("sha256:")[:16]
    if not dest.is_dir():
        dest.mkdir(parents=True)
        import io

        with tarfile.open(fileobj=io.BytesIO(blobs.get(rec.task_blob.digest))) as tar:
            tar.extractall(dest, filter="tar")
    return dest


def scratch_dir(home: Home) -> Path:
    """A fresh directory under ``home/tmp`` (removed by the caller)."""
    home.tmp.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="repro-", dir=home.tmp))


@dataclass
class ReproItem:
    """One re-run rollout compared with the original."""

    original: RolloutRecord
    replay: RolloutRecord | None
    outcome_match: bool
    diff_match: bool
    differences: list[str]


def _outcome(rec: RolloutRecord) -> tuple[Any, ...]:
    v = rec.verifier
    return (
        rec.status,
        None if v is None else v.reward,
        None if v is None else v.passed,
        None if v is None else v.error,
    )


def _diffset(rec: RolloutRecord) -> set[tuple[str, str, str | None]]:
    return {(c.path, c.kind, c.sha256) for c in rec.fs_diff}


def compare(original: RolloutRecord, replay: RolloutRecord) -> ReproItem:
    """Outcome (status, reward, passed, verifier error) and fs diff of two rollouts."""
    diffs: list[str] = []
    o, r = _outcome(original), _outcome(replay)
    for name, a, b in zip(("status", "reward", "passed", "verifier error"), o, r, strict=True):
        if a != b:
            diffs.append(f"{name}: {a!r} -> {b!r}")
    do, dr = _diffset(original), _diffset(replay)
    for path, kind, sha in sorted(do - dr)[:10]:
        diffs.append(f"fs: {kind} {path} {sha or ''} only in the original".rstrip())
    for path, kind, sha in sorted(dr - do)[:10]:
        diffs.append(f"fs: {kind} {path} {sha or ''} only in the replay".rstrip())
    return ReproItem(original, replay, o == r, do == dr, diffs)


async def repro_run(
    home: Home,
    meta: MetaStore,
    blobs: BlobStore,
    ref: str,
    *,
    concurrency: int = 4,
    events: RunEvents | None = None,
) -> tuple[RunRecord, list[ReproItem]]:
    """Re-run every final rollout of a run from its recorded baseline, task copy, agent and
    seed, in a new run; compare outcomes and filesystem diffs.

    Returns:
        The new run's record and one item per original rollout.
    """
    from rollbox.store.provenance import finalize_run

    events = events or RunEvents()
    src = meta.resolve_run(ref)
    originals = [
        r
        for r in meta.rollouts_of(src.id)
        if r.retried_by is None and r.status in ("done", "failed") and r.baseline_digest
    ]
    run = RunRecord(
        id=new_id("run"),
        args={**src.args, "repro_of": src.id},
        task_dirs=list(src.task_dirs),
        agent=src.agent,
        backend=src.backend,
        backend_reason=f"same backend as {src.id}",
        concurrency=max(1, concurrency),
        attempts=src.attempts,
        retries=0,
        owner_pid=os.getpid(),
        host=socket.gethostname(),
        rollbox_version=__version__,
    )
    meta.create_run(run)
    if events.on_start:
        events.on_start(run, len(originals))
    runners: dict[str, RolloutRunner] = {}
    asyncio.get_running_loop().set_default_executor(executor_for(concurrency))
    scratch = scratch_dir(home)
    items: list[ReproItem] = []

    async def one(orig: RolloutRecord) -> None:
        try:
            task = load_task(extract_task(blobs, orig, scratch))
            agent = parse_agent(orig.agent)
        except RollboxError as exc:
            items.append(ReproItem(orig, None, False, False, [f"cannot replay: {exc}"]))
            return
        backend = orig.backend or run.backend
        runner = runners.get(backend)
        if runner is None:
            runner = runners[backend] = RolloutRunner(
                home, meta, blobs, run_id=run.id, backend=backend, on_update=events.on_rollout
            )
        assert orig.baseline_digest is not None
        plan = RolloutPlan(
            task=task,
            attempt=orig.attempt,
            agent=agent,
            baseline=orig.baseline_digest,
            seed=orig.seed or 0,
            group_id=orig.group_id,
            setup_in_baseline=orig.group_id is not None,
            extra={"repro_of": orig.id},
        )
        rec = await runner.run(plan)
        item = compare(orig, rec)
        if task.digest != orig.task_digest:
            item.differences.insert(0, "task copy digest differs from the recorded one")
        items.append(item)

    status = "done"
    try:
        await run_pool(originals, one, max(1, concurrency))
    except BaseException:
        status = "interrupted"
        raise
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
        for r in runners.values():
            r.close()
        run.status = status  # type: ignore[assignment]
        run.finished_at = utcnow()
        matched = sum(1 for i in items if i.outcome_match and i.diff_match)
        run.summary = {"repro_of": src.id, "rollouts": len(items), "matched": matched}
        meta.update_run(run)
        try:
            run = finalize_run(meta, run)
        except RollboxError:
            pass
    items.sort(key=lambda i: (i.original.task_name, i.original.attempt))
    return run, items
