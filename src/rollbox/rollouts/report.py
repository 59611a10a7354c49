"""The run report: per-task results and platform figures, as a model and as rich tables.

``summarize`` is a pure function of a run record and its rollout records; ``render``
turns the summary into rich renderables. ``rollbox run`` prints it at the end of a run and
``rollbox report RUN`` prints it for a stored run.

Counting rules: a rollout superseded by a retry (``retried_by`` set) is excluded from the
per-task figures but counted in the platform figures (infra errors, retries).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from rollbox.backends.common.reasons import REASONS
from rollbox.models import (
    Phase,
    PlatformSummary,
    Quantiles,
    RolloutRecord,
    RunRecord,
    RunSummary,
    TaskSummary,
)


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation; None when empty."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def quantiles(values: list[float]) -> Quantiles:
    """p50/p95/p99/mean/max of a sample."""
    if not values:
        return Quantiles()
    return Quantiles(
        n=len(values),
        p50=quantile(values, 0.5),
        p95=quantile(values, 0.95),
        p99=quantile(values, 0.99),
        mean=sum(values) / len(values),
        max=max(values),
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` attempts of which ``c`` passed (Chen et al. 2021)."""
    if k > n or n == 0:
        raise ValueError(f"pass@{k} needs at least {k} attempts, have {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _ks(n: int) -> list[int]:
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(x for x in ks if x >= 1)


def _between(r: RolloutRecord, a: Phase, b: Phase) -> float | None:
    ta = r.phase_time(a)
    tb = r.phase_time(b)
    if ta is None or tb is None:
        return None
    return (tb - ta).total_seconds()


def _passed(r: RolloutRecord) -> bool:
    return r.status == "done" and r.verifier is not None and bool(r.verifier.passed)


def summarize(
    run: RunRecord, rollouts: list[RolloutRecord], cleanup: dict[str, Any] | None = None
) -> RunSummary:
    """The report of ``run`` from its rollout records.

    Args:
        run: The run record.
        rollouts: Every rollout record of the run, retried ones included.
        cleanup: ``{"ok": bool, "leftovers": [str, ...]}`` from a host-state check; by
            default the one stored in ``run.summary["cleanup"]``, if any.
    """
    final = [r for r in rollouts if r.retried_by is None]
    by_task: dict[str, list[RolloutRecord]] = defaultdict(list)
    for r in final:
        by_task[r.task_name].append(r)
    tasks = []
    for name in sorted(by_task):
        rs = by_task[name]
        n, c = len(rs), sum(_passed(r) for r in rs)
        rewards = [r.verifier.reward for r in rs if r.verifier and r.verifier.reward is not None]
        tasks.append(
            TaskSummary(
                task=name,
                task_digest=rs[0].task_digest,
                attempts=n,
                passed=c,
                pass_rate=c / n,
                mean_reward=sum(rewards) / len(rewards) if rewards else None,
                pass_at_k={str(k): pass_at_k(n, c, k) for k in _ks(n)},
                errors=sum(r.status in ("failed", "infra_error", "interrupted") for r in rs),
            )
        )
    prov = [d for r in rollouts if (d := _between(r, "provisioning", "setup")) is not None]
    queue = [d for r in rollouts if (d := _between(r, "queued", "provisioning")) is not None]
    total = []
    for r in rollouts:
        start = r.phase_time("queued") or r.created_at
        if r.finished_at is not None:
            total.append((r.finished_at - start).total_seconds())
    ends = [r.finished_at for r in rollouts if r.finished_at is not None]
    end: datetime | None = run.finished_at or (max(ends) if ends else None)
    wall = (end - run.created_at).total_seconds() if end is not None else None
    completed = sum(r.status == "done" for r in final)
    infra = sum(r.status == "infra_error" for r in rollouts)
    if cleanup is None:
        stored = run.summary.get("cleanup")
        cleanup = stored if isinstance(stored, dict) else None
    platform = PlatformSummary(
        rollouts=len(rollouts),
        final_rollouts=len(final),
        provisioning_s=quantiles(prov),
        queue_s=quantiles(queue),
        total_s=quantiles(total),
        successful_starts=sum(r.phase_time("setup") is not None for r in rollouts),
        completed=completed,
        completion_rate=completed / len(final) if final else 0.0,
        infra_errors=infra,
        infra_error_rate=infra / len(rollouts) if rollouts else 0.0,
        retries=sum(r.retry_of is not None for r in rollouts),
        wall_s=wall,
        throughput_per_s=len(ends) / wall if wall and ends else None,
        cleanup_ok=None if cleanup is None else bool(cleanup.get("ok")),
        cleanup_leftovers=[str(x) for x in (cleanup or {}).get("leftovers", [])],
        limits_reached={k: n for k in REASONS if (n := sum(k in r.reasons for r in final))},
    )
    all_rewards = [r.verifier.reward for r in final if r.verifier and r.verifier.reward is not None]
    return RunSummary(
        run_id=run.id,
        status=run.status,
        backend=run.backend,
        agent=run.agent,
        tasks=tasks,
        platform=platform,
        overall_pass_rate=sum(_passed(r) for r in final) / len(final) if final else None,
        mean_reward=sum(all_rewards) / len(all_rewards) if all_rewards else None,
        suspicious_changes=sum(len(r.suspicious_changes) for r in final),
        suspicious_rollouts=sum(bool(r.suspicious_changes) for r in final),
        unprotected_rollouts=sum(_unprotected(r) for r in final),
    )


def _unprotected(r: RolloutRecord) -> bool:
    """A shared-mode verifier that ran beside the agent's processes without isolation."""
    shared = r.verifier is not None and r.verifier.mode == "shared"
    return shared and r.extra.get("verifier_isolation") == "none"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


NAME_WIDTH = 24
"""Widest a name column gets; a longer name breaks after a separator (``- _ / . :``)."""

_AFTER_SEP = re.compile(r"(?<=[-_/.:])")


def fold_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` in lines of at most ``width`` characters, broken only after separators.

    A run of more than ``width`` characters without a separator is cut at ``width`` (the
    only case that breaks inside a word). Tables show names this way with ``no_wrap``, so the
    terminal width (80 columns, or a pipe's) never folds a name mid-word.
    """
    lines: list[str] = []
    cur = ""
    for part in _AFTER_SEP.split(name):
        while len(part) > width:
            if cur:
                lines.append(cur)
                cur = ""
            lines.append(part[:width])
            part = part[width:]
        if len(cur) + len(part) > width:
            lines.append(cur)
            cur = part
        else:
            cur += part
    if cur or not lines:
        lines.append(cur)
    return "\n".join(lines)


def name_column(table: Table, header: str, names: list[str]) -> None:
    """Add a column for names (task names, ids) that is never folded mid-word."""
    longest = max((len(n) for n in names), default=len(header))
    table.add_column(header, no_wrap=True, min_width=min(max(longest, len(header)), NAME_WIDTH))


def render(summary: RunSummary) -> Group:
    """The summary as rich renderables: a per-task table and a platform table."""
    # user-controlled strings (task names, agent specs) go in as Text: never rich markup
    # No vertical rules and no outer padding: the 7 columns fit 80 terminal columns with
    # names up to NAME_WIDTH; headers wrap between words, numbers and names never.
    tasks = Table(
        title=Text(f"run {summary.run_id} ({summary.status}) — agent {summary.agent}"),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    name_column(tasks, "task", [t.task for t in summary.tasks])
    for col, width in (("attempts", 8), ("passed", 6), ("pass rate", 4), ("mean reward", 6)):
        tasks.add_column(col, justify="right", min_width=width)
    tasks.add_column("pass@k", min_width=7)  # wraps between its "@k=v" items, never inside one
    tasks.add_column("errors", justify="right", min_width=6)
    for t in summary.tasks:
        tasks.add_row(
            Text(fold_name(t.task)),
            str(t.attempts),
            str(t.passed),
            f"{t.pass_rate:.0%}",
            _num(t.mean_reward),
            " ".join(f"@{k}={v:.2f}" for k, v in t.pass_at_k.items()),
            str(t.errors),
        )
    tasks.add_section()
    tasks.add_row(
        "all",
        str(sum(t.attempts for t in summary.tasks)),
        str(sum(t.passed for t in summary.tasks)),
        "-" if summary.overall_pass_rate is None else f"{summary.overall_pass_rate:.0%}",
        _num(summary.mean_reward),
        "",
        str(sum(t.errors for t in summary.tasks)),
    )
    p = summary.platform
    plat = Table(title=Text(f"platform ({summary.backend})"), show_header=True)
    plat.add_column("figure")
    plat.add_column("value", justify="right")
    for label, q in (
        ("provisioning latency", p.provisioning_s),
        ("queue time", p.queue_s),
        ("rollout time", p.total_s),
    ):
        plat.add_row(label, f"p50 {_ms(q.p50)}  p95 {_ms(q.p95)}  p99 {_ms(q.p99)}  (n={q.n})")
    plat.add_row("successful starts", f"{p.successful_starts}/{p.rollouts}")
    plat.add_row("completion rate", f"{p.completion_rate:.1%} ({p.completed}/{p.final_rollouts})")
    plat.add_row("infra error rate", f"{p.infra_error_rate:.1%} ({p.infra_errors})")
    plat.add_row("retries", str(p.retries))
    reached = ", ".join(f"{k} {n}" for k, n in p.limits_reached.items())
    plat.add_row("limits reached", reached or "-")
    plat.add_row("wall time", "-" if p.wall_s is None else f"{p.wall_s:.1f} s")
    plat.add_row("throughput", _num(p.throughput_per_s, "{:.1f} rollouts/s"))
    if p.cleanup_ok is None:
        clean = Text("not checked", style="dim")
    elif p.cleanup_ok:
        clean = Text("clean (host state before == after)", style="green")
    else:
        clean = Text("LEFTOVERS: " + ", ".join(p.cleanup_leftovers[:10]), style="red")
    plat.add_row("cleanup check", clean)
    sus = f"{summary.suspicious_changes} paths in {summary.suspicious_rollouts} rollouts"
    plat.add_row(
        "system files changed",
        Text(sus, style="yellow") if summary.suspicious_changes else Text(sus),
    )
    unprot = f"{summary.unprotected_rollouts} rollouts"
    plat.add_row(
        "unprotected verifier",
        Text(unprot, style="yellow") if summary.unprotected_rollouts else Text(unprot),
    )
    return Group(tasks, plat)
