"""Inspect, export and verify stored runs: ``runs ls``, ``report``, ``rollout show``,
``export`` and ``verify``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.text import Text

from rollbox.cli.output import JSON_OPTION, console, emit
from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.models import RolloutRecord, RunRecord, RunStatus

if TYPE_CHECKING:  # SQLAlchemy costs ~0.3 s to import: only commands that use the store pay it
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

DB_OPTION = typer.Option(
    None,
    "--db",
    envvar="ROLLBOX_DB",
    help="Database URL (postgresql://…); default: SQLite in ROLLBOX_HOME.",
)

runs_app = typer.Typer(help="List stored runs.", no_args_is_help=True)
rollout_app = typer.Typer(help="Inspect single rollouts.", no_args_is_help=True)


def _open(db: str | None) -> tuple[MetaStore, BlobStore]:
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

    home = Home.from_env()
    return MetaStore(db, home=home), BlobStore(home)


def effective_status(run: RunRecord) -> RunStatus:
    """The run's status, ``interrupted`` when it says running but its process is gone."""
    from rollbox.rollouts.stale import pid_alive

    if (
        run.status == "running"
        and run.owner_pid is not None
        and run.host in ("", socket.gethostname())
        and not pid_alive(run.owner_pid)
    ):
        return "interrupted"
    return run.status


@runs_app.command("ls")
def runs_ls(
    limit: int = typer.Option(50, "--limit", "-n", min=1, help="Show at most N runs."),
    db: str | None = DB_OPTION,
    json_: bool = JSON_OPTION,
) -> None:
    """List runs, newest first."""
    meta, _ = _open(db)
    with meta:
        runs = meta.list_runs(limit=limit)
        counts = {r.id: meta.count_rollouts(r.id) for r in runs}
    rows = []
    for r in runs:
        c = counts[r.id]
        rows.append(
            {
                "id": r.id,
                "status": effective_status(r),
                "created_at": r.created_at.isoformat(),
                "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                "agent": r.agent,
                "backend": r.backend,
                "tasks": len(r.task_dirs),
                "attempts": r.attempts,
                "rollouts": sum(c.values()),
                "by_status": c,
                "pass_rate": r.summary.get("overall_pass_rate"),
                "sealed": r.provenance_digest is not None,
            }
        )

    def human() -> None:
        if not rows:
            console.print("no runs")
            return
        header = ("run", "status", "created", "agent", "tasks×k", "rollouts", "pass")
        cells = []
        for row, r in zip(rows, runs, strict=True):
            pr = row["pass_rate"]
            cells.append(
                (
                    r.id,
                    str(row["status"]),
                    r.created_at.strftime("%m-%d %H:%M"),
                    f"{r.agent} ({r.backend})" if r.backend else r.agent,
                    f"{row['tasks']}×{r.attempts}",
                    " ".join(f"{k}:{v}" for k, v in sorted(counts[r.id].items())) or "0",
                    "-" if pr is None else f"{pr:.0%}",
                )
            )
        # plain aligned columns: never truncated, whatever the terminal width
        widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
        for c in [header, *cells]:
            line = "  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True))
            console.print(line.rstrip(), markup=False)

    emit(rows, json_, human)


@rollout_app.command("show")
def rollout_show(
    rollout: str = typer.Argument(..., help="Rollout id or unique prefix."),
    logs: bool = typer.Option(False, "--logs", help="Also print the captured stdout/stderr."),
    db: str | None = DB_OPTION,
    json_: bool = JSON_OPTION,
) -> None:
    """Show a rollout's provenance record."""
    meta, blobs = _open(db)
    with meta:
        rec = meta.resolve_rollout(rollout)
    emit(rec, json_, lambda: _show(rec, blobs, logs))


def _show(rec: RolloutRecord, blobs: BlobStore, logs: bool) -> None:
    # "field  value" lines, not a table: ids, digests and phase lists stay whole on one line
    # (a 2-column table at 80 columns folded sha256 digests mid-word)
    v = rec.verifier
    rows: list[tuple[str, str]] = [
        ("run", rec.run_id),
        ("task", f"{rec.task_name}  {rec.task_digest}"),
        ("attempt", f"{rec.attempt}  group {rec.group_id or '-'}  seed {rec.seed}"),
        ("agent", f"{rec.agent}  {json.dumps(rec.agent_config) if rec.agent_config else ''}"),
        ("status", rec.status + (f"  ({rec.error_kind}) {rec.error}" if rec.error else "")),
        (
            "reasons",
            "  ".join(f"{r} ({rec.reason_phases.get(r, '?')})" for r in rec.reasons) or "-",
        ),
        ("reward", "-" if v is None else f"{v.reward}  passed={v.passed}  {v.error or ''}"),
        ("exit codes", " ".join(f"{k}={c}" for k, c in rec.exit_codes.items()) or "-"),
        (
            "backend",
            f"{rec.backend} {rec.backend_version} {rec.accelerator or ''} on {rec.host}",
        ),
        ("baseline", " <- ".join(rec.baseline_lineage) or (rec.baseline_digest or "-")),
        ("limits", rec.limits.model_dump_json() if rec.limits else "-"),
        ("network", rec.network.model_dump_json() if rec.network else "-"),
        ("env names", ", ".join(rec.env_names) or "-"),
        (
            "phases",
            "  ".join(f"{p.phase}@{p.at.strftime('%H:%M:%S.%f')[:-3]}" for p in rec.phases),
        ),
        ("fs diff", f"{len(rec.fs_diff)} changes"),
        ("system files changed", ", ".join(rec.suspicious_changes[:20]) or "-"),
        ("blobs", "\n".join(f"{b.name}: {b.digest} ({b.size} B)" for b in rec.blob_refs())),
        ("retry", f"of {rec.retry_of or '-'}  by {rec.retried_by or '-'}"),
        ("provenance", rec.provenance_digest or "not sealed"),
    ]
    console.print(f"rollout {rec.id}", markup=False)
    width = max(len(k) for k, _ in rows) + 2
    for k, val in rows:
        first, *rest = val.split("\n") or [""]
        console.print(Text(k.ljust(width), style="bold") + Text(first))
        for line in rest:
            console.print(Text(" " * width + line))
    for ch in rec.fs_diff[:50]:
        console.print(
            f"  {ch.kind:8} {ch.path} {ch.size if ch.size is not None else ''}", markup=False
        )
    if logs:
        for ref in (rec.stdout, rec.stderr):
            if ref is not None and blobs.has(ref.digest):
                console.rule(ref.name)
                console.print(blobs.get(ref.digest).decode("utf-8", "replace"), markup=False)


def report_cmd(
    run: str = typer.Argument(..., help="Run id, unique prefix, or 'latest'."),
    db: str | None = DB_OPTION,
    json_: bool = JSON_OPTION,
) -> None:
    """Print a run's report: per-task pass rate, mean reward, pass@k and platform figures."""
    meta, _ = _open(db)
    with meta:
        rec = meta.resolve_run(run)
        status = effective_status(rec)
        if status != rec.status:
            rec = rec.model_copy(update={"status": status})
        from rollbox.rollouts.report import render, summarize

        summary = summarize(rec, meta.rollouts_of(rec.id))
    emit(summary, json_, lambda: console.print(render(summary)))


def export_cmd(
    run: str = typer.Argument(..., help="Run id, unique prefix, or 'latest'."),
    output: str = typer.Option(..., "--output", "-o", help="JSONL file to write ('-': stdout)."),
    include_blobs: bool = typer.Option(
        False, "--include-blobs", help="Embed every referenced blob's content."
    ),
    db: str | None = DB_OPTION,
    json_: bool = JSON_OPTION,
) -> None:
    """Export a run as JSONL, one rollout per line."""
    meta, blobs = _open(db)
    with meta:
        rec = meta.resolve_run(run)
        if output == "-":
            from rollbox.store.export import export_run

            n = export_run(meta, blobs, rec.id, sys.stdout, include_blobs)
            return
        dest = Path(output)
        if dest.is_dir():
            raise InvalidInputError(f"--output {output} is a directory", hint="name a file")
        if not dest.parent.is_dir():
            raise InvalidInputError(
                f"--output {output}: directory {dest.parent} does not exist", hint="create it"
            )
        # Write to a temporary file beside the target, rename at the end: never half-written.
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                from rollbox.store.export import export_run

                n = export_run(meta, blobs, rec.id, f, include_blobs)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    doc = {"run_id": rec.id, "output": str(dest), "rollouts": n, "include_blobs": include_blobs}
    emit(doc, json_, f"exported {n} rollouts of {rec.id} to {dest}")


def verify_cmd(
    run: str = typer.Argument(..., help="Run id, unique prefix, or 'latest'."),
    db: str | None = DB_OPTION,
    json_: bool = JSON_OPTION,
) -> None:
    """Recompute every digest of a run; name any tampered or missing record or blob.

    Exits 1 when a problem is found.
    """
    meta, blobs = _open(db)
    with meta:
        rec = meta.resolve_run(run)
        from rollbox.store.verify import verify_run

        report = verify_run(meta, blobs, rec.id)

    def human() -> None:
        for w in report.warnings:
            console.print(f"[yellow]warning:[/] {escape(w)}")
        for p in report.problems:
            console.print(f"[red]problem:[/] {escape(p)}")
        verdict = "[green]OK[/]" if report.ok else f"[red]FAILED ({len(report.problems)})[/]"
        console.print(
            f"verify {report.run_id}: {verdict} — {report.rollouts_checked} rollouts,"
            f" {report.blobs_checked} blob references ({report.distinct_blobs} distinct blobs"
            f" re-hashed), run sealed: {report.sealed}"
        )

    emit(report, json_, human)
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``runs``, ``rollout``, ``report``, ``export`` and ``verify`` to the root app."""
    app.add_typer(runs_app, name="runs")
    app.add_typer(rollout_app, name="rollout")
    app.command("report")(report_cmd)
    app.command("export")(export_cmd)
    app.command("verify")(verify_cmd)


__all__ = ["effective_status", "register"]
