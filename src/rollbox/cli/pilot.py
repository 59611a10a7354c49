"""``rollbox pilot``: measure provisioning, throughput and cleanup under concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from rollbox.cli import validate
from rollbox.cli.output import JSON_OPTION, console, emit, err_console
from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.models import Limits


def parse_levels(text: str) -> list[int]:
    """``"1,4,16"`` → ``[1, 4, 16]``.

    Raises:
        InvalidInputError: not a comma-separated list of integers >= 1.
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1 or int(part) > 1024:
            raise InvalidInputError(
                f"bad concurrency level {part!r} in {text!r}",
                hint="give comma-separated integers from 1 to 1024, e.g. 1,4,16",
            )
        out.append(int(part))
    return out


def parse_backends(text: str) -> list[str]:
    """``"namespace,gvisor"`` → names, each checked against the registry.

    Raises:
        UnknownBackendError: a name is not registered.
    """
    from rollbox.backends.registry import backend_class

    names = [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise InvalidInputError("--backend needs at least one backend name")
    for n in names:
        backend_class(n)
    return names


def register(app: typer.Typer) -> None:
    """Add ``rollbox pilot`` to ``app``."""

    @app.command("pilot")
    def pilot_cmd(
        backend: str = typer.Option("namespace", "--backend", help="Backend(s), comma-separated."),
        workload: str = typer.Option(
            "sleep", "--workload", help="TASK_DIR, sleep[:S], cpu[:S] or disk[:MB]."
        ),
        rollouts: int = typer.Option(50, "--rollouts", help="Rollouts per concurrency level."),
        concurrency: str = typer.Option("1,4,16", "--concurrency", help="Levels, e.g. 1,4,16."),
        plot: Path | None = typer.Option(None, "--plot", help="Write a PNG plot here."),
        html_out: Path | None = typer.Option(None, "--html", help="Write an HTML report here."),
        baseline: str | None = typer.Option(None, "--baseline", help="Baseline (default one)."),
        retries: int = typer.Option(1, "--retries", help="Retries after an infra error."),
        raw_samples: int = typer.Option(
            30,
            "--raw-samples",
            help="Raw-tool starts per level (0: skip).",
            callback=validate.int_range("--raw-samples", 0, 100_000),
        ),
        json_: bool = JSON_OPTION,
    ) -> None:
        """Run N rollouts per concurrency level and report latency, throughput and cleanup."""
        from rollbox.pilot.measure import PilotConfig, run_pilot
        from rollbox.pilot.workloads import parse_workload

        if rollouts < 1 or rollouts > 100_000:
            raise InvalidInputError(f"--rollouts must be 1..100000, got {rollouts}")
        if retries < 0 or retries > 10:
            raise InvalidInputError(f"--retries must be 0..10, got {retries}")
        if raw_samples < 0:
            raise InvalidInputError(f"--raw-samples must be >= 0, got {raw_samples}")
        for out in (plot, html_out):
            if out is not None and not out.parent.absolute().is_dir():
                raise InvalidInputError(f"output directory does not exist: {out.parent}")
        levels = parse_levels(concurrency)
        backends = parse_backends(backend)
        wl = parse_workload(workload)
        home = Home.from_env().ensure()
        cfg_baseline, layer_dirs = _resolve_baseline(home, baseline)
        cfg = PilotConfig(
            backends=backends,
            workload=wl,
            rollouts=rollouts,
            concurrency=levels,
            home=home,
            baseline=cfg_baseline,
            layer_dirs=list(layer_dirs),
            retries=retries,
            raw_samples=raw_samples,
            limits=Limits(memory_mb=256, disk_mb=256),
        )
        progress = None if json_ else (lambda m: err_console.print(f"[dim]{m}[/dim]"))
        report = asyncio.run(run_pilot(cfg, progress))
        png: bytes | None = None
        if plot is not None or html_out is not None:
            from rollbox.pilot.plot import render_png

            target = plot or home.tmp / "pilot-plot.png"
            render_png(report, target)
            png = target.read_bytes()
            if plot is None:
                target.unlink()
        if html_out is not None:
            from rollbox.pilot.html import render_html

            render_html(report, png, html_out)

        def human() -> None:
            from rollbox.pilot.table import rich_table

            # one wide table where it fits, else two that fit 80 columns (pilot/table.py)
            console.print(rich_table(report))
            for b in report.backends:
                if b.error:
                    console.print(f"[red]{b.backend} not piloted:[/red] {b.error}")
                for lv in b.levels:
                    if not lv.cleanup.clean:
                        console.print(
                            f"[red]leaked ({b.backend}, c={lv.concurrency}):[/red] "
                            f"{lv.cleanup.leaked}"
                        )
                    for e in lv.error_samples:
                        console.print(f"[yellow]{b.backend} c={lv.concurrency}:[/yellow] {e}")
                    if not lv.raw.available:
                        console.print(f"raw {lv.raw.tool} not timed: {lv.raw.reason}")
            if plot is not None:
                console.print(f"plot: {plot}")
            if html_out is not None:
                console.print(f"html: {html_out}")

        emit(report, json_, human)
        if not report.ok:
            raise typer.Exit(1)


def _resolve_baseline(home: Home, ref: str | None) -> tuple[str, list[Path]]:
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(home)
    info = store.default() if ref is None else store.resolve(ref)
    return info.digest, store.layer_dirs(info.digest)
