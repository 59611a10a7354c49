"""``rollbox audit --repro``: K rollouts of one deterministic task from one baseline must
end identically — same outcome, same filesystem diff. Any difference is named by path and
value.

The rollouts go through the rollout runner (``rollbox.rollouts.runs.Run``) with the
``oracle`` agent, so what is compared is exactly what ``rollbox run`` records, and judged by
the same comparator as ``rollbox repro`` (:func:`rollbox.rollouts.repro.differences`). Without
``--task``, a built-in deterministic task is written to a scratch directory: its solution
adds, modifies and deletes files (content computed, not random) and its verifier checks them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rollbox.config import Home
from rollbox.models import Model
from rollbox.rollouts.repro import Difference, differences, fs_of, outcome_of

__all__ = [
    "Difference",
    "ReproReport",
    "compare",
    "fs_of",
    "outcome_of",
    "render_repro",
    "run_repro",
    "write_builtin_task",
]

_TASK_TOML = """\
[task]
name = "rollbox-audit-repro"

[metadata]
category = "audit"

[agent]
timeout_sec = 60

[verifier]
timeout_sec = 60

[environment]
network_mode = "none"
"""

_SOLVE = """\
#!/bin/sh
set -e
mkdir -p /app/out
python3 -c 'import hashlib; print(hashlib.sha256(b"rb" * 999).hexdigest())' >/app/out/hash.txt
seq 1 500 | sort -r > /app/out/numbers.txt
printf 'key=value\\n' >> /etc/environment
rm -f /etc/issue.net
ln -sf /app/out/hash.txt /app/out/link
"""

_TEST = """\
#!/bin/sh
mkdir -p /logs/verifier
want=$(python3 -c 'import hashlib; print(hashlib.sha256(b"rb" * 999).hexdigest())')
if [ "$(cat /app/out/hash.txt)" = "$want" ] \\
   && [ "$(wc -l < /app/out/numbers.txt)" -eq 500 ] && [ ! -e /etc/issue.net ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def write_builtin_task(dest: Path) -> Path:
    """Write the built-in deterministic task into ``dest`` and return it."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "instruction.md").write_text(
        "Write /app/out/hash.txt and /app/out/numbers.txt, append to /etc/environment, "
        "remove /etc/issue.net.\n"
    )
    (dest / "task.toml").write_text(_TASK_TOML)
    for sub, name, text in (("solution", "solve.sh", _SOLVE), ("tests", "test.sh", _TEST)):
        (dest / sub).mkdir(exist_ok=True)
        (dest / sub / name).write_text(text)
        (dest / sub / name).chmod(0o755)
    return dest


class ReproReport(Model):
    """The result of ``audit --repro``."""

    kind: str = "rollbox-audit-repro"
    """Document type."""
    backend: str
    """Backend used."""
    baseline: str
    """Baseline digest every rollout started from."""
    task: str
    """Task directory."""
    k: int
    """Rollouts compared."""
    run_id: str
    """The run that holds the rollouts."""
    rollouts: list[str]
    """Rollout ids."""
    outcomes: dict[str, dict[str, Any]]
    """Rollout id → outcome (status, exit codes, reward)."""
    fs_paths: int
    """Paths in the (first) filesystem diff."""
    identical: bool
    """Every outcome and every diff entry is the same."""
    all_done: bool
    """Every rollout reached ``done`` (identical failures prove little)."""
    differences: list[Difference] = []
    """What differs."""


compare = differences
"""The audit's name for the one comparator (:func:`rollbox.rollouts.repro.differences`)."""


async def run_repro(
    home: Home, backend: str, baseline: str, k: int, task: Path | None
) -> ReproReport:
    """Run ``k`` oracle rollouts of ``task`` (default: the built-in one) and compare them.

    Raises:
        TaskError: the task directory is malformed.
    """
    from rollbox.rollouts.runs import Run, RunOptions
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

    scratch: Path | None = None
    if task is None:
        scratch = Path(tempfile.mkdtemp(prefix="repro-", dir=home.tmp))
        task_dir = write_builtin_task(scratch / "rollbox-audit-repro")
        (task_dir / "task.toml").write_text(_TASK_TOML + f'\n[rollbox]\nbaseline = "{baseline}"\n')
    else:
        task_dir = task.resolve()
    try:
        meta = MetaStore(home=home)
        run = Run(
            home,
            meta,
            BlobStore(home),
            RunOptions(
                task_dirs=[str(task_dir)],
                agent="oracle",
                attempts=k,
                concurrency=min(k, 4),
                backend=backend,
                retries=1,
            ),
        )
        run.start_new()
        result = await run.execute()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    recs = [r for r in result.rollouts if r.retried_by is None] if result.rollouts else []
    diffs = compare(recs)
    return ReproReport(
        backend=backend,
        baseline=recs[0].baseline_digest if recs else baseline,
        task=str(task or "built-in"),
        k=k,
        run_id=result.run.id,
        rollouts=[r.id for r in recs],
        outcomes={r.id: outcome_of(r) for r in recs},
        fs_paths=len(fs_of(recs[0])) if recs else 0,
        identical=bool(recs) and len(recs) == k and not diffs,
        all_done=bool(recs) and all(r.status == "done" for r in recs),
        differences=diffs,
    )


def render_repro(report: ReproReport, console: Console) -> None:
    """Print the repro verdict and any differences."""
    verdict = "[green]identical[/green]" if report.identical else "[bold red]DIFFER[/bold red]"
    if not report.all_done:
        verdict += " [yellow](not every rollout reached done)[/yellow]"
    console.print(
        f"repro on {report.backend}: {report.k} rollouts of {report.task} from "
        f"{report.baseline[:19]} — {verdict} ({report.fs_paths} changed paths each; run "
        f"{report.run_id})"
    )
    first = next(iter(report.outcomes.values()), {})
    console.print(f"outcome: {first}")
    if report.differences:
        t = Table(title="differences")
        t.add_column("what")
        for rid in report.rollouts:
            t.add_column(rid[-8:])
        for d in report.differences:
            t.add_row(d.what, *[str(d.values.get(rid, "")) for rid in report.rollouts])
        console.print(t)
