"""``rollbox doctor [--json]``: what this host offers each backend, and how to get the rest.

Exit code 0 when every backend can run here, 1 when one cannot (the output names the
missing pieces and the fix for each). Read-only: nothing is built or changed.
"""

from __future__ import annotations

import typer

from rollbox.cli.output import JSON_OPTION, emit
from rollbox.config import Home
from rollbox.hostcheck import HostReport, check_host


def render(report: HostReport) -> str:
    """The report as text: one line per check, then one per backend."""
    lines = [f"kernel {report.kernel}, cgroups {report.cgroup_mode}, root: {report.root}", ""]
    width = max(len(c.name) for c in report.checks)
    for c in report.checks:
        mark = "ok  " if c.ok else ("MISS" if c.needed_by else "opt ")
        need = f"  (for {', '.join(c.needed_by)})" if c.needed_by else ""
        lines.append(f"{mark} {c.name:<{width}}  {c.detail}{need}")
        if not c.ok and c.fix:
            lines.append(f"     {'':<{width}}  fix: {c.fix}")
    lines.append("")
    for name, r in report.backends.items():
        state = "ready" if r.ready else f"NOT ready (missing: {', '.join(r.missing)})"
        lines.append(f"backend {name}: {state}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the top-level ``doctor`` command."""

    @app.command("doctor")
    def doctor_cmd(json_: bool = JSON_OPTION) -> None:
        """Check this host for every backend and say what is missing and how to get it."""
        home = Home.from_env()
        report = check_host(home)
        emit(report, json_, render(report))
        if not all(r.ready for r in report.backends.values()):
            raise typer.Exit(1)
