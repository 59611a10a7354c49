"""Stale runs: runs and rollout records whose ``rollbox run`` process is gone.

A run whose process was killed (SIGKILL) is found by :func:`reap_stale_runs` (its owner pid is
gone) and marked ``interrupted``, as is any rollout record left ``running``/``queued`` in a run
no live process owns; ``Run.start_resume`` then runs exactly the slots that have no final
record.
"""

from __future__ import annotations

import os
import socket

from rollbox.errors import RollboxError
from rollbox.models import RunRecord, utcnow
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

FINAL = ("done", "failed", "infra_error")
UNFINISHED = ("queued", "running")
"""Rollout statuses that only a live ``rollbox run`` process may hold."""


def pid_alive(pid: int | None) -> bool:
    """True when a process with that pid exists (``None``: no process)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_runs(meta: MetaStore) -> list[str]:
    """Ids of runs :func:`reap_stale_runs` would mark: marked ``running`` with their
    ``rollbox run`` process (on this host) gone, or closed with an unfinished record."""
    here = socket.gethostname()
    out = []
    for run in meta.list_runs():
        if run.host and run.host != here:
            continue
        if run.status == "running":
            if not pid_alive(run.owner_pid):
                out.append(run.id)
        elif any(meta.count_rollouts(run.id).get(s) for s in UNFINISHED):
            out.append(run.id)
    return out


def reap_stale_runs(meta: MetaStore, blobs: BlobStore) -> list[str]:
    """Mark runs whose ``rollbox run`` process is gone as ``interrupted``.

    Their unfinished rollout records become ``interrupted`` (sealed); finished ones are left
    exactly as they are. Runs already closed (``interrupted``, ``done``, ``failed``) that
    still hold a ``running`` or ``queued`` record (their process was killed while closing)
    get those records marked too. Returns the ids of the runs marked.
    """
    marked: list[str] = []
    here = socket.gethostname()
    for run in meta.list_runs():
        if run.status == "running" and pid_alive(run.owner_pid):
            continue
        if run.host and run.host != here:
            continue  # a shared PostgreSQL store: another machine's pids mean nothing here
        if interrupt_run(meta, blobs, run):
            marked.append(run.id)
    return marked


def interrupt_run(meta: MetaStore, blobs: BlobStore, run: RunRecord) -> bool:
    """Mark a run no live process is executing: a ``running`` run becomes ``interrupted``,
    and its ``running``/``queued`` records too (sealed; final records untouched).

    Returns:
        True when anything changed.
    """
    from rollbox.store.provenance import finalize_run

    fixed = _interrupt_unfinished(meta, blobs, run)
    if run.status != "running" and not fixed:
        return False
    if run.status == "running":
        run.status = "interrupted"
        run.finished_at = utcnow()
    meta.update_run(run)
    try:
        finalize_run(meta, meta.get_run(run.id))
    except RollboxError:
        pass
    return True


def _interrupt_unfinished(meta: MetaStore, blobs: BlobStore, run: RunRecord) -> int:
    """Seal the run's ``running``/``queued`` records as ``interrupted``; how many."""
    from rollbox.store.provenance import seal

    if not any(meta.count_rollouts(run.id).get(s) for s in UNFINISHED):
        return 0  # one grouped query per run; records are read only when needed
    n = 0
    for rec in meta.rollouts_of(run.id):
        if rec.status not in UNFINISHED:
            continue
        rec.status = "interrupted"
        rec.error = f"rollbox run (pid {run.owner_pid}) died before this rollout finished"
        rec.error_kind = "infra"
        rec.stamp("interrupted")
        rec.finished_at = utcnow()
        meta.save_rollout(seal(rec, blobs))
        n += 1
    return n
