"""Terminal output: the run report and rollout show stay readable at 80 columns and in pipes.

Before, a piped ``rollbox report`` (rich's 80-column fallback) folded task names mid-word:
``build-repo / rt-artifac / ts``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from rollbox.cli.output import PIPE_WIDTH, output_width
from rollbox.config import Home
from rollbox.rollouts.report import NAME_WIDTH, fold_name, render, summarize
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore
from rollbox.store.metadata import MetaStore

from .records import make_rollout, make_run

NAMES = [
    "build-repo",
    "build-report-artifacts",
    "sum-numbers-separate",
    "a-really-long-task-name-that-goes-on-and-on-forever-x",
]


def test_fold_name_breaks_only_after_separators() -> None:
    assert fold_name("build-report-artifacts") == "build-report-artifacts"
    long = "a-really-long-task-name-that-goes-on-and-on-forever-x"
    lines = fold_name(long).split("\n")
    assert "".join(lines) == long
    assert all(len(x) <= NAME_WIDTH for x in lines)
    assert all(x.endswith(("-", "_", "/", ".", ":")) for x in lines[:-1])
    # a separator-free run longer than the width is the one case cut inside a word
    assert fold_name("x" * 30, 24) == "x" * 24 + "\n" + "x" * 6
    assert fold_name("ab/" + "c" * 30, 24) == "ab/\n" + "c" * 24 + "\n" + "c" * 6
    assert fold_name("") == ""


def _summary(blobs: BlobStore) -> object:
    run = make_run(status="done")
    ros = [make_rollout(blobs, run.id, n, k, reward=float(k % 2)) for n in NAMES for k in range(4)]
    return summarize(run, ros, cleanup={"ok": True, "leftovers": []})


def _check_layout(text: str, width: int) -> None:
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= width, "\n".join(x for x in lines if len(x) > width)
    for name in NAMES:
        if len(name) <= NAME_WIDTH:  # whole, on one line
            assert any(name in x.split() for x in lines), name
        else:  # folded only after its separators
            for part in fold_name(name).split("\n"):
                assert any(part in x.split() for x in lines), part
    assert "…" not in text  # nothing cut off
    header = next(x for x in lines if x.lstrip().startswith("task"))
    assert header.split()[-1] == "errors"  # the last column is still there


def test_report_at_80_columns(blobs: BlobStore) -> None:
    console = Console(file=io.StringIO(), width=80, record=True)
    console.print(render(_summary(blobs)))  # type: ignore[arg-type]
    _check_layout(console.export_text(), 80)


def test_output_width_off_a_terminal() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "w") as pipe:
        assert output_width(pipe, {}) == PIPE_WIDTH
        assert output_width(pipe, {"COLUMNS": "80"}) == 80
        assert output_width(pipe, {"COLUMNS": "wide"}) == PIPE_WIDTH
        assert output_width(pipe, {"COLUMNS": "3"}) == PIPE_WIDTH
    os.close(r)
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        assert output_width(tty, {"COLUMNS": "80"}) is None  # a terminal: rich asks it
    os.close(leader)


def _stored(meta: MetaStore, blobs: BlobStore) -> tuple[str, str]:
    run = make_run(status="done")
    meta.create_run(run)
    ros = [make_rollout(blobs, run.id, n, k, reward=float(k % 2)) for n in NAMES for k in range(2)]
    for r in ros:
        meta.save_rollout(r)
    provenance.finalize_run(meta, run)
    return run.id, ros[0].id


def _piped(env_columns: str | None, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if env_columns is not None:
        env["COLUMNS"] = env_columns
    res = subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True,  # stdout is a pipe, as in `rollbox report RUN | less`
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize(("columns", "width"), [(None, PIPE_WIDTH), ("80", 80)])
def test_report_in_a_pipe(
    home: Home, meta: MetaStore, blobs: BlobStore, columns: str | None, width: int
) -> None:
    run_id, _ = _stored(meta, blobs)
    _check_layout(_piped(columns, "report", run_id), width)


def test_rollout_show_in_a_pipe_keeps_digests_whole(
    home: Home, meta: MetaStore, blobs: BlobStore
) -> None:
    _, ro_id = _stored(meta, blobs)
    rec = meta.get_rollout(ro_id)
    out = _piped("80", "rollout", "show", ro_id)
    assert rec.provenance_digest and rec.provenance_digest in out.split()
    assert f"rollout {ro_id}" in out.splitlines()
    assert "…" not in out
