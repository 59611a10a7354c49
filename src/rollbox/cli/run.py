"""``rollbox run`` (tasks × attempts in fresh sandboxes) and ``rollbox repro`` (re-run a run).

::

    rollbox run examples/tasks/* --agent oracle --attempts 4 --concurrency 4
    rollbox run --resume run-01j...          # finish what a killed run left
    rollbox repro run-01j...                 # same baselines, tasks, agents, seeds: compare
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rollbox.cli import validate
from rollbox.cli.output import JSON_OPTION, console, emit, err_console, fail
from rollbox.config import Home
from rollbox.models import RolloutRecord, RunRecord

_TERMINAL = ("done", "failed", "infra_error", "interrupted")


class _Live:
    """A rich progress bar with live counts (on stderr; nothing in ``--json`` mode)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.counts: Counter[str] = Counter()
        self.running: set[str] = set()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=err_console,
            disable=not enabled,
            transient=False,
        )
        self.task_id: Any = None

    def start(self, run: RunRecord, total: int) -> None:
        if self.enabled:
            self.progress.start()
        self.task_id = self.progress.add_task(run.id, total=total, counts="")

    def update(self, rec: RolloutRecord) -> None:
        if rec.status in _TERMINAL:
            self.running.discard(rec.id)
            key: str = rec.status
            if rec.status == "done":
                key = "passed" if rec.verifier and rec.verifier.passed else "not passed"
            self.counts[key] += 1
            # An infra error is usually retried: the slot is not finished yet.
            advance = 0 if rec.status == "infra_error" else 1
        else:
            self.running.add(rec.id)
            advance = 0
        text = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        text += f" running={len(self.running)}"
        if self.task_id is not None:
            self.progress.update(self.task_id, advance=advance, counts=text)

    def stop(self) -> None:
        if self.enabled:
            self.progress.stop()


def _stores(db: str | None) -> tuple[Home, Any, Any]:
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

    home = Home.from_env().ensure()
    return home, MetaStore(db, home=home), BlobStore(home)


async def _with_signals(coro: Any, stoppable: Callable[[], bool] = lambda: True) -> Any:
    """Run ``coro``; the first SIGINT or SIGTERM cancels it (clean teardown), once.

    A second signal only says what is going on: a second cancellation would cut short the
    teardown the first one started (sandboxes destroyed, records saved ``interrupted``); a
    third exits at once (what is left is ``rollbox cleanup``'s). A signal that arrives
    once ``stoppable()`` is False (every rollout already final) is ignored too: the run
    finishes and is reported as usual.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    fired: list[int] = []

    def on_signal(sig: int) -> None:
        if task is None or not stoppable():
            return
        fired.append(sig)
        if len(fired) == 1:
            task.cancel()
        elif len(fired) == 2:
            err_console.print(
                "stopping: destroying sandboxes and saving records; "
                "a third signal abandons them (then run `rollbox cleanup`)"
            )
        else:
            os._exit(130)  # the user insists: owner-pid and TTL let cleanup finish the job

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        return await coro
    finally:
        for sig in installed:
            # Ignored, not restored: nothing is left to interrupt, and a late signal must
            # not raise KeyboardInterrupt while the report is printed.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)


def _raise_interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _mark_interrupted(meta: Any, blobs: Any, run_id: str) -> None:
    """An interrupt outside the run's own cancellation path (start-up, shutdown): whatever
    the store still shows as running becomes ``interrupted``."""
    from rollbox.rollouts.stale import interrupt_run

    with contextlib.suppress(Exception), _ignoring_signals():
        interrupt_run(meta, blobs, meta.get_run(run_id))


@contextlib.contextmanager
def _ignoring_signals() -> Any:
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``repro`` to the top-level app."""

    @app.command("run")
    def run_cmd(
        task_dirs: list[Path] = typer.Argument(None, help="Harbor task directories."),
        agent: str = typer.Option(
            "oracle", "--agent", help="oracle, nop, cmd:<command> or python:<module>:<callable>."
        ),
        attempts: int | None = typer.Option(
            None,
            "--attempts",
            help="Attempts per task (default: the task's \\[rollbox] attempts, or 1).",
            callback=validate.int_range("--attempts", 1, validate.MAX_COUNT),
        ),
        concurrency: int = typer.Option(
            4,
            "--concurrency",
            help="Rollouts at once.",
            callback=validate.int_range("--concurrency", 1, validate.MAX_CONCURRENCY),
        ),
        backend: str = typer.Option(
            "auto", "--backend", help="namespace, gvisor, microvm or auto."
        ),
        retries: int = typer.Option(
            1,
            "--retries",
            help="Retries per rollout (infra errors).",
            callback=validate.int_range("--retries", 0, 10),
        ),
        group_from_snapshot: bool = typer.Option(
            False, "--group-from-snapshot", help="Set up once per task, fork attempts from it."
        ),
        db: str | None = typer.Option(
            None, "--db", envvar="ROLLBOX_DB", help="Metadata store URL (default SQLite)."
        ),
        resume: str | None = typer.Option(None, "--resume", help="Finish an interrupted run."),
        seed: int = typer.Option(
            0, "--seed", help="Base seed of the per-rollout seeds.", callback=validate.seed()
        ),
        max_rollouts: int | None = typer.Option(
            None,
            "--max-rollouts",
            help="Allow more than 10,000 rollouts (tasks × attempts) in this run.",
            callback=validate.int_range("--max-rollouts", 1, validate.MAX_COUNT * 1000),
        ),
        json_: bool = JSON_OPTION,
    ) -> None:
        """Run Harbor tasks × attempts, each in a fresh sandbox; print the report."""
        from rollbox.rollouts.report import render, summarize
        from rollbox.rollouts.runs import Run, RunEvents, RunOptions

        if resume and task_dirs:
            raise fail("give either TASK_DIR... or --resume RUN, not both", json_mode=json_)
        if not resume and not task_dirs:
            raise fail("no task directories given (rollbox run TASK_DIR...)", json_mode=json_)
        for d in task_dirs or []:
            if not d.is_dir():
                raise fail(f"task directory {d} does not exist", json_mode=json_)
        home, meta, blobs = _stores(db)
        options = RunOptions(
            task_dirs=[str(d) for d in task_dirs or []],
            agent=agent,
            attempts=attempts,
            concurrency=concurrency,
            backend=backend,
            retries=retries,
            group_from_snapshot=group_from_snapshot,
            seed=seed,
            max_rollouts=max_rollouts,
        )
        live = _Live(enabled=not json_)
        events = RunEvents(on_start=live.start, on_rollout=live.update)
        runner = Run(home, meta, blobs, options, events=events)
        # Until the event loop takes over, SIGTERM interrupts like Ctrl-C (never a silent
        # death that leaves the run record "running").
        signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            run = runner.start_resume(resume) if resume else runner.start_new()
            choice = runner.choice
            assert choice is not None
            if not json_:
                verb = "resuming" if resume else "run"
                console.print(f"{verb} {run.id}: agent {runner.options.agent}")
                console.print(f"backend: {choice.name} ({choice.reason})")
            asyncio.run(_with_signals(runner.execute(), lambda: runner.stoppable))
        except (KeyboardInterrupt, asyncio.CancelledError):
            if runner.run is None:  # before the run record existed: nothing to mark
                raise typer.Exit(130) from None
            run = runner.run
            if not runner.completed:  # else: the signal came after the run was closed
                _mark_interrupted(meta, blobs, run.id)
                live.stop()
                msg = f"interrupted: {run.id} (finish it with: rollbox run --resume {run.id})"
                if json_:
                    emit({"run_id": run.id, "status": "interrupted"}, True)
                else:
                    err_console.print(msg)
                raise typer.Exit(130) from None
        finally:
            live.stop()
        final = runner.run
        assert final is not None
        summary = summarize(final, meta.rollouts_of(final.id))
        if json_:
            emit(
                {
                    "run_id": final.id,
                    "status": final.status,
                    "backend": final.backend,
                    "backend_reason": final.backend_reason,
                    "summary": summary,
                    "cleanup": final.summary.get("cleanup"),
                },
                True,
            )
            return
        console.print(render(summary))
        console.print(
            f"inspect: rollbox report {final.id} | rollbox verify {final.id}"
            f" | rollbox export {final.id} -o {final.id}.jsonl"
        )

    @app.command("repro")
    def repro_cmd(
        run_ref: str = typer.Argument(..., help="Run id (or unique prefix) to re-run."),
        concurrency: int = typer.Option(
            4,
            "--concurrency",
            help="Rollouts at once.",
            callback=validate.int_range("--concurrency", 1, validate.MAX_CONCURRENCY),
        ),
        db: str | None = typer.Option(
            None, "--db", envvar="ROLLBOX_DB", help="Metadata store URL (default SQLite)."
        ),
        json_: bool = JSON_OPTION,
    ) -> None:
        """Re-run each rollout of RUN from its recorded baseline, task copy, agent and seed;
        report which outcomes and filesystem diffs match and what differs."""
        from rollbox.rollouts.repro import repro_run
        from rollbox.rollouts.run_options import RunEvents

        if concurrency < 1:
            raise fail("--concurrency must be at least 1", json_mode=json_)
        home, meta, blobs = _stores(db)
        live = _Live(enabled=not json_)
        events = RunEvents(on_start=live.start, on_rollout=live.update)
        try:
            new_run, items = asyncio.run(
                _with_signals(
                    repro_run(home, meta, blobs, run_ref, concurrency=concurrency, events=events)
                )
            )
        except (KeyboardInterrupt, asyncio.CancelledError):
            live.stop()
            err_console.print("interrupted")
            raise typer.Exit(130) from None
        finally:
            live.stop()
        matched = sum(1 for i in items if i.outcome_match and i.diff_match)
        doc = {
            "repro_run_id": new_run.id,
            "of": new_run.summary.get("repro_of"),
            "rollouts": len(items),
            "matched": matched,
            "items": [
                {
                    "original": i.original.id,
                    "replay": i.replay.id if i.replay else None,
                    "task": i.original.task_name,
                    "attempt": i.original.attempt,
                    "outcome_match": i.outcome_match,
                    "fs_diff_match": i.diff_match,
                    "differences": i.differences,
                }
                for i in items
            ],
        }

        def human() -> None:
            from rollbox.rollouts.report import fold_name, name_column

            # ids and differences go below the table as whole lines: in a column they would
            # be folded mid-id at 80 columns
            table = Table(title=Text(f"repro of {doc['of']} as {new_run.id}"), box=box.SIMPLE_HEAD)
            name_column(table, "task", [i.original.task_name for i in items])
            for col in ("attempt", "outcome", "fs diff"):
                table.add_column(col, no_wrap=True)
            for i in items:
                table.add_row(
                    Text(fold_name(i.original.task_name)),
                    str(i.original.attempt),
                    "match" if i.outcome_match else "[red]differs",
                    "match" if i.diff_match else "[red]differs",
                )
            console.print(table)
            for i in items:
                if i.outcome_match and i.diff_match:
                    continue
                replay = i.replay.id if i.replay else "not replayed"
                head = f"{i.original.task_name} #{i.original.attempt}: {i.original.id} -> {replay}"
                console.print(head, markup=False)
                for d in i.differences:
                    console.print(f"  {d}", markup=False)
            console.print(f"{matched}/{len(items)} rollouts reproduced exactly")

        emit(doc, json_, human)
        if matched != len(items):
            raise typer.Exit(1)
