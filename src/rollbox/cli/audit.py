"""``rollbox audit``: adversarial probes inside real sandboxes; ``--repro`` determinism check."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rollbox.cli import validate
from rollbox.cli.output import JSON_OPTION, console, emit, err_console
from rollbox.config import Home
from rollbox.errors import InvalidInputError

_STYLE = {"pass": "green", "breach": "bold red", "error": "yellow", "skip": "dim"}


def register(app: typer.Typer) -> None:
    """Add ``rollbox audit`` to ``app``."""

    @app.command("audit")
    def audit_cmd(
        backend: str = typer.Option("namespace", "--backend", help="Backend to audit."),
        baseline: str | None = typer.Option(None, "--baseline", help="Baseline (default one)."),
        cycles: int = typer.Option(
            1000,
            "--cycles",
            help="Create/destroy cycles of the residue probe (0: skip it).",
            callback=validate.int_range("--cycles", 0, validate.MAX_COUNT),
        ),
        probe: list[str] = typer.Option([], "--probe", help="Run only this probe (repeatable)."),
        skip: list[str] = typer.Option([], "--skip", help="Skip this probe (repeatable)."),
        list_: bool = typer.Option(False, "--list", help="List the probes and exit."),
        repro: bool = typer.Option(False, "--repro", help="Run the reproducibility check."),
        k: int = typer.Option(
            5,
            "--k",
            help="Rollouts of the --repro check.",
            callback=validate.int_range("--k", 1, 1000),
        ),
        task: Path | None = typer.Option(
            None, "--task", help="--repro: a deterministic task dir (default: built-in one)."
        ),
        json_: bool = JSON_OPTION,
    ) -> None:
        """Probe isolation with adversarial programs inside real sandboxes; exit 1 on any
        breach."""
        from rollbox.audit.registry import PROBES
        from rollbox.audit.runner import run_audit, select
        from rollbox.backends.registry import backend_class

        if list_:
            rows = [{"name": p.name, "category": p.category, "checks": p.doc} for p in PROBES]

            def show() -> None:
                for r in rows:
                    console.print(f"{r['name']:28} {r['category']:12} {r['checks']}")

            emit(rows, json_, show)
            return
        if cycles < 0 or cycles > 100_000:
            raise InvalidInputError(f"--cycles must be 0..100000, got {cycles}")
        backend_class(backend)  # unknown backend: one line, exit 2
        chosen = select(probe or None, skip or None)
        if repro and (k < 2 or k > 1000):
            raise InvalidInputError(f"--k must be 2..1000 (rollouts to compare), got {k}")
        if task is not None and not task.is_dir():
            raise InvalidInputError(f"--task {task} is not a directory")
        home = Home.from_env().ensure()
        digest, layer_dirs = _resolve_baseline(home, baseline)
        if repro:
            _repro(home, backend, digest, k, task, json_)
            return

        def progress(res: object) -> None:
            from rollbox.audit.models import ProbeResult

            assert isinstance(res, ProbeResult)
            st = _STYLE.get(res.status, "")
            err_console.print(f"[{st}]{res.status:6}[/{st}] {res.name} ({res.duration_s:.1f} s)")

        report = asyncio.run(
            run_audit(
                home,
                backend,
                digest,
                list(layer_dirs),
                probes=chosen,
                cycles=cycles,
                progress=None if json_ else progress,
            )
        )

        def human() -> None:
            t = Table(
                title=f"rollbox audit — {report.backend} ({report.backend_version})",
                title_justify="left",
            )
            t.add_column("probe")
            t.add_column("category")
            t.add_column("result")
            t.add_column("evidence summary", overflow="fold")
            for r in report.probes:
                st = _STYLE.get(r.status, "")
                t.add_row(r.name, r.category, f"[{st}]{r.status}[/{st}]", r.summary)
            Console(highlight=False, width=max(console.width, 160)).print(t)
            console.print(
                f"{len(report.probes)} probes: {report.passed} pass, {report.breaches} breach, "
                f"{report.errors} error, {report.skipped} skip"
                + (f"; LEFT ON HOST: {report.host_leaks}" if report.host_leaks else "")
            )

        emit(report, json_, human)
        if not report.ok:
            raise typer.Exit(1)


def _resolve_baseline(home: Home, ref: str | None) -> tuple[str, list[Path]]:
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(home)
    info = store.default() if ref is None else store.resolve(ref)
    return info.digest, store.layer_dirs(info.digest)


def _repro(home: Home, backend: str, digest: str, k: int, task: Path | None, json_: bool) -> None:
    from rollbox.audit.repro import render_repro, run_repro

    report = asyncio.run(run_repro(home, backend, digest, k, task))
    emit(report, json_, lambda: render_repro(report, console))
    if not (report.identical and report.all_done):
        raise typer.Exit(1)
