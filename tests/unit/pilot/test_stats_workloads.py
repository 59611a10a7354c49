"""Statistics and workload parsing of the pilot."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.cli.pilot import parse_levels
from rollbox.errors import InvalidInputError
from rollbox.pilot.stats import percentile, ratio, summarize
from rollbox.pilot.workloads import parse_workload


def test_percentile_interpolates_between_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_converts_to_ms() -> None:
    s = summarize([0.001, 0.002, 0.003, 0.010])
    assert s.n == 4
    assert s.p50_ms == pytest.approx(2.5)
    assert s.min_ms == pytest.approx(1.0)
    assert s.max_ms == pytest.approx(10.0)
    assert s.p95_ms == pytest.approx(8.95)
    assert summarize([]).n == 0 and summarize([]).p50_ms is None


def test_ratio() -> None:
    assert ratio(10.0, 4.0) == 2.5
    assert ratio(None, 4.0) is None
    assert ratio(1.0, 0.0) is None


def test_parse_workload_builtins() -> None:
    assert parse_workload("sleep").command() == ["sleep", "0.05"]
    assert parse_workload("sleep:0.5").command() == ["sleep", "0.5"]
    cpu = parse_workload("cpu:0.1")
    assert cpu.command()[0] == "python3" and "0.1" in cpu.command()[2]
    disk = parse_workload("disk:8")
    assert "count=8" in disk.command()[2]


@pytest.mark.parametrize("bad", ["nap", "sleep:x", "cpu:-1", "disk:99999", ""])
def test_parse_workload_bad(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_workload(bad)


def test_parse_workload_task_dir(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    with pytest.raises(InvalidInputError, match="not a Harbor task"):
        parse_workload(str(tmp_path / "t"))
    (tmp_path / "t" / "task.toml").write_text("[task]\n")
    wl = parse_workload(str(tmp_path / "t"))
    assert wl.kind == "task" and wl.task_dir == (tmp_path / "t").resolve()


def test_parse_levels() -> None:
    assert parse_levels("1,4,16") == [1, 4, 16]
    for bad in ("0", "1,,2", "a", "-1", "2000"):
        with pytest.raises(InvalidInputError):
            parse_levels(bad)
