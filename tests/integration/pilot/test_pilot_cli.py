"""``rollbox pilot`` end to end on real sandboxes, at small scale."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from integration.clihelp import need_backend, run_cli
from rollbox.config import Home

pytestmark = [pytest.mark.root]


@pytest.mark.slow
def test_pilot_namespace_table_json_png_html(shared_home: Home, tmp_path: Path) -> None:
    need_backend("namespace", shared_home)
    png, page = tmp_path / "pilot.png", tmp_path / "pilot.html"
    r = run_cli(
        shared_home,
        "pilot",
        "--backend", "namespace",
        "--rollouts", "10",
        "--concurrency", "1,4",
        "--raw-samples", "5",
        "--plot", str(png),
        "--html", str(page),
        "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "rollbox-pilot" and doc["rollouts"] == 10
    (b,) = doc["backends"]
    assert b["backend"] == "namespace" and b["error"] is None
    assert [lv["concurrency"] for lv in b["levels"]] == [1, 4]
    for lv in b["levels"]:
        assert lv["successful_starts"] == 10 and lv["completed"] == 10
        assert lv["completion_rate"] == 1.0 and lv["gave_up"] == 0
        prov = lv["provisioning"]
        assert prov["n"] == 10 and 0 < prov["p50_ms"] <= prov["p95_ms"] <= prov["p99_ms"]
        assert lv["raw"]["tool"] == "bwrap" and lv["raw"]["available"], lv["raw"]
        assert lv["raw"]["start"]["n"] == 5 and lv["ratio_p50"] > 0
        assert lv["throughput_per_s"] > 0
        assert lv["cleanup"]["clean"], lv["cleanup"]
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert base64.b64encode(data).decode() in page.read_text()


@pytest.mark.slow
def test_pilot_two_backends_side_by_side(shared_home: Home, tmp_path: Path) -> None:
    need_backend("namespace", shared_home)
    need_backend("gvisor", shared_home)
    r = run_cli(
        shared_home,
        "pilot",
        "--backend", "namespace,gvisor",
        "--workload", "cpu:0.05",
        "--rollouts", "4",
        "--concurrency", "1,2",
        "--raw-samples", "3",
        "--plot", str(tmp_path / "p.png"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "namespace" in r.stdout and "gvisor" in r.stdout and "LEAK" not in r.stdout
    assert (tmp_path / "p.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--concurrency", "0"], "bad concurrency level"),
        (["--backend", "nope"], "unknown backend"),
        (["--workload", "nap"], "unknown workload"),
        (["--rollouts", "0"], "--rollouts"),
        (["--plot", "/nonexistent-dir/x.png"], "output directory does not exist"),
    ],
)
def test_pilot_bad_input_one_line_exit_2(home: Home, args: list[str], needle: str) -> None:
    r = run_cli(home, "pilot", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in r.stderr
    assert not home.sandboxes.exists() or not any(home.sandboxes.iterdir())
