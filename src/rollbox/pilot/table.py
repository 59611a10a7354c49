"""The pilot's text table (rich) and plain rows shared with the HTML report."""

from __future__ import annotations

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


def rich_table(report: PilotReport) -> Table:
    """The table printed by ``rollbox pilot`` (latencies in ms)."""
    t = Table(
        title=f"rollbox pilot — {report.workload}, {report.rollouts} rollouts/level (ms)",
        title_justify="left",
    )
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("backend", "cleanup") else "right")
    for r in rows(report):
        t.add_row(*r)
    return t
