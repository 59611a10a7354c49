"""Run the probes against one backend, in order, and collect the report."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable

from rollbox.audit import (  # importing registers the probes
    probes_isolation,
    probes_kernel,
    probes_network,
    probes_residue,
    probes_store,
)
from rollbox.audit.context import AuditContext, ProbeError
from rollbox.audit.models import AuditReport, ProbeResult
from rollbox.audit.registry import PROBES, Probe
from rollbox.backends.registry import get_backend
from rollbox.config import Home
from rollbox.errors import InvalidInputError, RollboxError
from rollbox.models import utcnow
from rollbox.pilot.hostscope import capture, scoped_leaks

Progress = Callable[[ProbeResult], None]


_MODULES = [
    m.__name__
    for m in (probes_isolation, probes_kernel, probes_network, probes_residue, probes_store)
]


def ordered() -> list[Probe]:
    """Every probe in run order: by module as listed above, then as defined in it (the
    registry's own order follows whichever module was imported first)."""
    return sorted(PROBES, key=lambda p: _MODULES.index(p.fn.__module__))


def probe_names() -> list[str]:
    """Every probe's name, in run order."""
    return [p.name for p in ordered()]


def select(only: list[str] | None, skip: list[str] | None) -> list[Probe]:
    """The probes to run.

    Raises:
        InvalidInputError: an unknown probe name.
    """
    names = set(probe_names())
    for n in (only or []) + (skip or []):
        if n not in names:
            raise InvalidInputError(f"unknown probe {n!r}", hint="see 'rollbox audit --list'")
    return [p for p in ordered() if (not only or p.name in only) and p.name not in (skip or [])]


async def _run_probe(ctx: AuditContext, p: Probe, timeout: float) -> ProbeResult:
    t0 = time.perf_counter()
    try:
        out = await asyncio.wait_for(p.fn(ctx), timeout)
        status, summary, evidence = out.status, out.summary, out.evidence
    except ProbeError as exc:
        status, summary, evidence = "error", f"probe could not run: {exc}", {}
    except TimeoutError:
        status, summary, evidence = "error", f"probe timed out after {timeout:.0f} s", {}
    except InvalidInputError:
        raise
    except (RollboxError, OSError, KeyError, ValueError) as exc:
        status, summary = "error", f"{type(exc).__name__}: {exc}"
        evidence = {"traceback": traceback.format_exc(limit=4)}
    return ProbeResult(
        name=p.name,
        category=p.category,
        status=status,
        summary=summary,
        evidence=evidence,
        duration_s=round(time.perf_counter() - t0, 3),
    )


async def run_audit(
    home: Home,
    backend: str,
    baseline: str,
    layer_dirs: list[object],
    *,
    probes: list[Probe] | None = None,
    cycles: int = 1000,
    progress: Progress | None = None,
) -> AuditReport:
    """Run ``probes`` (default all) against ``backend`` and report.

    Raises:
        InvalidInputError: the backend or baseline is unknown.
        BackendUnavailableError: the backend cannot run here.
    """
    from pathlib import Path

    be = get_backend(backend, home)
    be.prepare()
    ctx = AuditContext(
        home=home,
        backend=backend,
        baseline=baseline,
        layer_dirs=[Path(str(d)) for d in layer_dirs],
        cycles=cycles,
        capabilities=be.capabilities,
    )
    started = utcnow()
    before = await asyncio.to_thread(capture, home)
    results: list[ProbeResult] = []
    try:
        await ctx.start_canaries()
        try:
            await ctx.detect_kernel()
        except (RollboxError, OSError) as exc:
            ctx.kernel = {"shared": True, "error": f"{type(exc).__name__}: {exc}"}
        for p in probes if probes is not None else ordered():
            timeout = 120.0 + (ctx.cycles * 2.0 if p.name == "residue-cycles" else 0.0)
            res = await _run_probe(ctx, p, timeout)
            results.append(res)
            if progress:
                progress(res)
    finally:
        await ctx.close()
    after = await asyncio.to_thread(capture, home)
    leaks = scoped_leaks(before, after, home, ctx.created_ids)
    own = [p for p in ctx.own_resources if Path(p).exists()]
    if own:
        leaks["audit_own"] = own
    return AuditReport(
        backend=backend,
        backend_version=be.version(),
        baseline=baseline,
        started_at=started,
        finished_at=utcnow(),
        probes=results,
        breaches=sum(r.status == "breach" for r in results),
        errors=sum(r.status == "error" for r in results),
        passed=sum(r.status == "pass" for r in results),
        skipped=sum(r.status == "skip" for r in results),
        host_leaks=leaks,
        kernel=ctx.kernel,
    )
