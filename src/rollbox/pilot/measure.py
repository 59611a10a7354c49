"""The pilot driver: N rollouts per concurrency level per backend, timed phase by phase.

Each rollout: wait for a concurrency slot (queue time) → create a sandbox and run ``true``
in it (provisioning; an infrastructure error is retried in a fresh sandbox up to
``retries`` times) → run the workload → destroy. The raw tool does the same bare start at
the same concurrency just before each level, and the host state is listed before and after
each level to check cleanup.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

from rollbox import __version__
from rollbox.config import Home
from rollbox.errors import BackendError, BackendUnavailableError, InvalidInputError, RollboxError
from rollbox.models import utcnow
from rollbox.pilot import raw
from rollbox.pilot.hostscope import capture, scoped_leaks
from rollbox.pilot.models import (
    BackendResult,
    Cleanup,
    LevelResult,
    PilotConfig,
    PilotReport,
    RawTiming,
    RolloutSample,
    SandboxLike,
)
from rollbox.pilot.stats import ratio, summarize

Progress = Callable[[str], None]

# PilotConfig and the sandbox protocol live in pilot/models.py (pilot/tasks.py needs them too);
# they are re-exported here for the callers that import them from this module.
__all__ = ["PilotConfig", "Progress", "SandboxLike", "run_level", "run_pilot"]


def _err_line(exc: BaseException) -> str:
    msg = exc.one_line() if isinstance(exc, RollboxError) else str(exc)
    return f"{type(exc).__name__}: {msg}"[:300]


async def _one_rollout(
    cfg: PilotConfig, backend: str, index: int, sem: asyncio.Semaphore, created: set[str]
) -> RolloutSample:
    t_submit = time.perf_counter()
    async with sem:
        t_slot = time.perf_counter()
        queue_s = t_slot - t_submit
        errors: list[str] = []
        sbx: SandboxLike | None = None
        provision_s: float | None = None
        attempts = 0
        for _ in range(cfg.retries + 1):
            attempts += 1
            t0 = time.perf_counter()
            cand: SandboxLike | None = None
            try:
                cand = await cfg.factory(cfg.baseline, backend, cfg.limits, cfg.home)
                sid = getattr(cand, "id", None)
                if isinstance(sid, str):
                    created.add(sid)
                first = await cand.exec(["true"], timeout=60)
                if first.exit_code != 0:
                    raise BackendError(f"first exec of true exited {first.exit_code}")
                provision_s = time.perf_counter() - t0
                sbx = cand
                break
            except InvalidInputError:
                if cand is not None:
                    await asyncio.shield(cand.destroy())
                raise
            except Exception as exc:  # any other failure to start is an infrastructure error
                errors.append(_err_line(exc))
                if cand is not None:
                    try:
                        await asyncio.shield(cand.destroy())
                    except Exception as dexc:
                        errors.append("destroy after failed start: " + _err_line(dexc))
        if sbx is None:
            return RolloutSample(
                index=index,
                status="infra_error",
                attempts=attempts,
                queue_s=queue_s,
                total_s=time.perf_counter() - t_submit,
                errors=errors,
            )
        status = "failed"
        workload_s: float | None = None
        try:
            t1 = time.perf_counter()
            try:
                res = await sbx.exec(cfg.workload.command(), timeout=cfg.workload.timeout())
                status = "completed" if res.exit_code == 0 else "failed"
            except RollboxError as exc:
                errors.append(_err_line(exc))
            workload_s = time.perf_counter() - t1
        finally:
            t2 = time.perf_counter()
            try:
                await asyncio.shield(sbx.destroy())
            except Exception as exc:
                errors.append("destroy: " + _err_line(exc))
            destroy_s = time.perf_counter() - t2
        return RolloutSample(
            index=index,
            status=status,  # type: ignore[arg-type]
            attempts=attempts,
            queue_s=queue_s,
            provision_s=provision_s,
            workload_s=workload_s,
            destroy_s=destroy_s,
            total_s=time.perf_counter() - t_submit,
            errors=errors,
        )


async def _raw_timing(cfg: PilotConfig, backend: str, concurrency: int) -> RawTiming:
    tool = raw.RAW_TOOL.get(backend, backend)
    if not cfg.layer_dirs or cfg.raw_samples <= 0:
        return RawTiming(tool=tool, available=False, reason="raw timing disabled or no layers")
    scratch = raw.raw_scratch(cfg.home)
    try:
        with raw.rootfs_of([Path(p) for p in cfg.layer_dirs], scratch) as root:
            timer = raw.make_timer(backend, root, scratch, cfg.home)
            reason = await asyncio.to_thread(timer.available)
            if reason:
                return RawTiming(tool=timer.tool, available=False, reason=reason)
            await asyncio.to_thread(timer.setup)
            try:
                n = min(cfg.raw_samples, max(cfg.rollouts, 1))
                if backend == "microvm":
                    n = min(n, 5)  # a boot takes seconds
                await raw.time_raw(timer, 1, 1)  # warm the page cache, as rollbox had it warm
                samples = await raw.time_raw(timer, n, concurrency)
            finally:
                await asyncio.to_thread(timer.teardown)
            return RawTiming(
                tool=timer.tool,
                available=True,
                start=summarize(samples),
                command=" ".join(timer.command("ID")),
            )
    except Exception as exc:
        return RawTiming(tool=tool, available=False, reason=_err_line(exc))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _builtin_level(
    cfg: PilotConfig, backend: str, concurrency: int, created: set[str]
) -> tuple[list[RolloutSample], float]:
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(_one_rollout(cfg, backend, i, sem, created))
                for i in range(cfg.rollouts)
            ]
    except BaseExceptionGroup as group:  # surface the user's error as itself, not a group
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks], time.perf_counter() - t0


async def run_level(cfg: PilotConfig, backend: str, concurrency: int) -> LevelResult:
    """Run one concurrency level of one backend."""
    raw_timing = await _raw_timing(cfg, backend, concurrency)
    before = await asyncio.to_thread(capture, cfg.home)
    created: set[str] = set()
    if cfg.workload.kind == "task":
        from rollbox.pilot.tasks import run_task_level

        samples, wall = await run_task_level(cfg, backend, concurrency, created)
    else:
        samples, wall = await _builtin_level(cfg, backend, concurrency, created)
    after = await asyncio.to_thread(capture, cfg.home)
    leaked = scoped_leaks(before, after, cfg.home, created)
    host_new = {k: len(v) for k, v in before.diff(after).items()}
    started = [s for s in samples if s.provision_s is not None]
    completed = [s for s in samples if s.status == "completed"]
    infra = sum(len([e for e in s.errors if not e.startswith("destroy")]) for s in samples)
    prov = summarize([s.provision_s for s in started if s.provision_s is not None])
    distinct: list[str] = []
    for s in samples:
        for e in s.errors:
            if e not in distinct and len(distinct) < 5:
                distinct.append(e)
    return LevelResult(
        concurrency=concurrency,
        rollouts=len(samples),
        successful_starts=len(started),
        completed=len(completed),
        completion_rate=round(len(completed) / len(samples), 4) if samples else 0.0,
        infra_errors=infra,
        retries=sum(s.attempts - 1 for s in samples),
        retry_successes=sum(1 for s in started if s.attempts > 1),
        gave_up=sum(1 for s in samples if s.status == "infra_error"),
        wall_s=round(wall, 3),
        throughput_per_s=round(len(completed) / wall, 2) if wall > 0 else 0.0,
        provisioning=prov,
        queue=summarize([s.queue_s for s in samples]),
        workload=summarize([s.workload_s for s in samples if s.workload_s is not None]),
        destroy=summarize([s.destroy_s for s in samples if s.destroy_s is not None]),
        total=summarize([s.total_s for s in samples]),
        raw=raw_timing,
        ratio_p50=ratio(prov.p50_ms, raw_timing.start.p50_ms),
        ratio_p99=ratio(prov.p99_ms, raw_timing.start.p99_ms),
        cleanup=Cleanup(
            clean=not leaked,
            leaked=leaked,
            host_wide_new=host_new,
            before=before.counts(),
            after=after.counts(),
        ),
        error_samples=distinct,
    )


def _backend_version(backend: str, home: Home) -> str:
    try:
        from rollbox.backends.registry import get_backend

        return get_backend(backend, home).version()
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


async def run_pilot(cfg: PilotConfig, progress: Progress | None = None) -> PilotReport:
    """Run every level of every backend, in order (levels never overlap).

    Raises:
        InvalidInputError: bad input met while starting (unknown backend, baseline...).
    """
    say = progress or (lambda _m: None)
    if cfg.workload.kind == "task":
        from rollbox.rollouts.tasks import load_task

        load_task(cfg.workload.task_dir or "")  # a malformed task: one line, exit 2
    started = utcnow()
    results: list[BackendResult] = []
    for backend in cfg.backends:
        res = BackendResult(backend=backend, version=_backend_version(backend, cfg.home))
        try:
            await asyncio.to_thread(cfg.prepare, backend, cfg.home)
        except BackendUnavailableError as exc:
            if len(cfg.backends) == 1:
                raise
            res.error = exc.one_line()  # the other backends are still piloted
            say(f"{backend}: unavailable: {res.error}")
            results.append(res)
            continue
        for level in cfg.concurrency:
            say(f"{backend}: {cfg.rollouts} rollouts at concurrency {level}")
            lv = await run_level(cfg, backend, level)
            res.levels.append(lv)
            say(
                f"{backend} c={level}: {lv.completed}/{lv.rollouts} completed, "
                f"provisioning p50 {lv.provisioning.p50_ms} ms, {lv.throughput_per_s}/s"
            )
        results.append(res)
    return PilotReport(
        started_at=started,
        finished_at=utcnow(),
        host=socket.gethostname(),
        cpus=os.cpu_count() or 1,
        rollbox_version=__version__,
        baseline=cfg.baseline,
        workload=cfg.workload.label,
        rollouts=cfg.rollouts,
        concurrency=list(cfg.concurrency),
        retries=cfg.retries,
        backends=results,
    )
