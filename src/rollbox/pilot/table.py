"""The pilot's text table (rich) and plain rows shared with the HTML report."""

from __future__ import annotations

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table

from rollbox.pilot.models import LevelResult, PilotReport

COLUMNS = [
    "backend",
    "conc",
    "starts",
    "done",
    "compl %",
    "infra err",
    "retries (ok)",
    "prov p50",
    "p95",
    "p99",
    "raw p50",
    "ratio p50",
    "queue p50",
    "rollouts/s",
    "cleanup",
]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def level_row(backend: str, lv: LevelResult) -> list[str]:
    """One table row (all cells as text)."""
    raw_p50 = _ms(lv.raw.start.p50_ms) if lv.raw.available else "n/a"
    cleanup = "clean" if lv.cleanup.clean else "LEAK " + ",".join(lv.cleanup.leaked)
    return [
        backend,
        str(lv.concurrency),
        f"{lv.successful_starts}/{lv.rollouts}",
        str(lv.completed),
        f"{lv.completion_rate * 100:.1f}",
        str(lv.infra_errors),
        f"{lv.retries} ({lv.retry_successes})",
        _ms(lv.provisioning.p50_ms),
        _ms(lv.provisioning.p95_ms),
        _ms(lv.provisioning.p99_ms),
        raw_p50,
        "-" if lv.ratio_p50 is None else f"{lv.ratio_p50:.2f}x",
        _ms(lv.queue.p50_ms),
        f"{lv.throughput_per_s:.1f}",
        cleanup,
    ]


def rows(report: PilotReport) -> list[list[str]]:
    """Every level of every backend as table rows."""
    return [level_row(b.backend, lv) for b in report.backends for lv in b.levels]


OUTCOMES = ["backend", "conc", "starts", "done", "compl %", "infra err", "retries (ok)",
            "rollouts/s", "cleanup"]  # fmt: skip
"""Columns of the first of the two narrow tables (the second has the latencies)."""
LATENCIES = ["backend", "conc", "prov p50", "p95", "p99", "raw p50", "ratio p50", "queue p50"]


class PilotTable:
    """The table printed by ``rollbox pilot`` (latencies in ms): one table where the width
    allows all 15 columns, else two (outcomes, latencies) that each fit 80 columns — never a
    backend name or a number folded inside a cell."""

    def __init__(self, report: PilotReport) -> None:
        self.report = report

    def table(self, columns: list[str], title: str | None = None, compact: bool = False) -> Table:
        """The rows of the report restricted to ``columns``; ``compact``: headers one word a
        line and no vertical rules (the narrow tables)."""
        r = self.report
        t = Table(
            title=title or f"rollbox pilot — {r.workload}, {r.rollouts} rollouts/level (ms)",
            title_justify="left",
        )
        if compact:
            t.box, t.show_edge, t.pad_edge, t.collapse_padding = box.SIMPLE_HEAD, False, False, True
        for c in columns:
            left = c in ("backend", "cleanup")
            t.add_column(
                c.replace(" ", "\n") if compact else c,
                justify="left" if left else "right",
                no_wrap=c != "cleanup",
            )
        idx = [COLUMNS.index(c) for c in columns]
        for row in rows(r):
            t.add_row(*[row[i] for i in idx])
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = self.table(COLUMNS)
        natural = console.measure(wide, options=options.update_width(10_000)).maximum
        if natural <= options.max_width:
            yield wide
            return
        r = self.report
        head = f"rollbox pilot — {r.workload}, {r.rollouts} rollouts/level"
        yield self.table(OUTCOMES, f"{head}: outcomes", compact=True)
        yield self.table(LATENCIES, f"{head}: latencies (ms)", compact=True)


def rich_table(report: PilotReport) -> PilotTable:
    """The renderable printed by ``rollbox pilot`` (see :class:`PilotTable`)."""
    return PilotTable(report)
