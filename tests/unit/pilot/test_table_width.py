"""The pilot table at 80 columns (two tables) and wide (one), nothing folded inside a cell."""

from __future__ import annotations

import asyncio
import io

from rich.console import Console

from rollbox.config import Home
from rollbox.pilot.table import COLUMNS, LATENCIES, OUTCOMES, rich_table

from .test_measure import FakeFactory, _cfg


def _text(report: object, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(rich_table(report))  # type: ignore[arg-type]
    return console.export_text()


def test_pilot_table_fits_80_columns_as_two_tables(home: Home) -> None:
    from rollbox.pilot.measure import run_pilot

    report = asyncio.run(run_pilot(_cfg(home, FakeFactory(), backends=["namespace"])))
    narrow = _text(report, 80)
    lines = narrow.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert "…" not in narrow
    assert sum(1 for x in lines if x.split()[:1] == ["namespace"]) == 2 * 2  # 2 levels, 2 tables
    assert "outcomes" in narrow and "latencies (ms)" in narrow
    assert set(OUTCOMES) | set(LATENCIES) == set(COLUMNS)
    wide = _text(report, 200)
    assert "outcomes" not in wide  # one table when all 15 columns fit
    assert sum(1 for x in wide.splitlines() if "namespace" in x) == 2
    header = next(x for x in wide.splitlines() if "backend" in x)
    assert all(c.split()[0] in header for c in COLUMNS)
