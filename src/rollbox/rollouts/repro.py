"""Reproducibility: re-run rollouts from their records and compare them.

One comparator (:func:`differences`: outcome fields incl. exit codes and error, and every
filesystem diff entry by kind, type, size and hash) serves ``rollbox repro RUN``
(:func:`repro_run`, original vs replay through :func:`compare`) and ``rollbox audit --repro``
(K rollouts of one task, in ``rollbox.audit.repro``).
"""

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
from rollbox.models import Model, RolloutRecord, RunRecord, utcnow
from rollbox.rollouts.agents import parse_agent
from rollbox.rollouts.run_options import RunEvents, executor_for
from rollbox.rollouts.runner import RolloutPlan, RolloutRunner
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


class Difference(Model):
    """One path or field whose value is not the same in every rollout."""

    what: str
    """``outcome:<field>`` or ``fs:<path>``."""
    values: dict[str, Any]
    """Rollout id → value (``absent`` when the path is not in that rollout's diff)."""


def outcome_of(rec: RolloutRecord) -> dict[str, Any]:
    """The fields of a rollout's outcome that must repeat.

    Exit codes and the error line count as much as the reward: a replay whose agent now
    exits 1 (or fails for another reason) is not the same rollout, even if the verifier still
    gives the same reward.
    """
    v = rec.verifier
    return {
        "status": rec.status,
        "error": rec.error,
        "exit_codes": dict(sorted(rec.exit_codes.items())),
        "reward": v.reward if v else None,
        "passed": v.passed if v else None,
        "verifier_error": v.error if v else None,
    }


def fs_of(rec: RolloutRecord) -> dict[str, str]:
    """Path → ``kind type size sha256`` of a rollout's filesystem diff.

    The object type and size count too: a path that is a directory in one rollout and a
    symlink in another has no content hash in either (``sha256`` is None for both).
    """
    return {c.path: f"{c.kind} {c.type} {c.size} {c.sha256}" for c in rec.fs_diff}


def differences(records: list[RolloutRecord]) -> list[Difference]:
    """Every outcome field and diff path whose value is not the same across ``records``.

    The one comparator of rollbox: ``rollbox repro`` (two rollouts) and ``rollbox audit
    --repro`` (K rollouts) both judge through it.
    """
    diffs: list[Difference] = []
    outs = {r.id: outcome_of(r) for r in records}
    fields = sorted({f for o in outs.values() for f in o})
    for f in fields:
        vals = {rid: o.get(f) for rid, o in outs.items()}
        if len({repr(v) for v in vals.values()}) > 1:
            diffs.append(Difference(what=f"outcome:{f}", values=vals))
    fss = {r.id: fs_of(r) for r in records}
    paths = sorted({p for fs in fss.values() for p in fs})
    for p in paths:
        vals = {rid: fs.get(p, "absent") for rid, fs in fss.items()}
        if len(set(vals.values())) > 1:
            diffs.append(Difference(what=f"fs:{p}", values=vals))
    return diffs


MAX_FS_LINES = 20
"""Filesystem differences spelled out per replayed rollout (the rest are counted)."""


def compare(original: RolloutRecord, replay: RolloutRecord) -> ReproItem:
    """Outcome and filesystem diff of a rollout and its replay, through :func:`differences`."""
    if original.id == replay.id:
        raise ValueError("a rollout cannot be compared with itself")
    found = differences([original, replay])
    lines: list[str] = []
    fs = [d for d in found if d.what.startswith("fs:")]
    for d in found:
        a, b = d.values[original.id], d.values[replay.id]
        if d.what.startswith("outcome:"):
            lines.append(f"{d.what.removeprefix('outcome:')}: {a!r} -> {b!r}")
    for d in fs[:MAX_FS_LINES]:
        a, b = d.values[original.id], d.values[replay.id]
        path = d.what.removeprefix("fs:")
        if b == "absent":
            lines.append(f"fs: {path} ({a}) only in the original")
        elif a == "absent":
            lines.append(f"fs: {path} ({b}) only in the replay")
        else:
            lines.append(f"fs: {path}: {a} -> {b}")
    if len(fs) > MAX_FS_LINES:
        lines.append(f"fs: {len(fs) - MAX_FS_LINES} more paths differ")
    return ReproItem(original, replay, len(fs) == len(found), not fs, lines)


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
