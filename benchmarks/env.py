"""Benchmark: the step-driven env API (``rollbox.env``) beside the sandbox API under it.

* **step overhead**: ``AsyncTaskEnv.step("true")`` vs ``sandbox.exec(["bash", "-c", "true"])``
  on the same episode's sandbox, interleaved; the overhead is the difference of the p50s
  (action parsing, trajectory bookkeeping).
* **64 resets at once**: 64 envs of ``examples/tasks/hello-file`` reset concurrently (each a
  rollout: a run record, a sandbox, the instruction written, the record saved) vs 64 bare
  ``AsyncSandbox.create`` with the task's baseline, limits and network, concurrently; per-call
  latency p50/p99 and throughput (calls / wall second). Both sides are torn down after.

Usage: ``python benchmarks/env.py [--steps 300] [--envs 64] [--rounds 3]`` (root;
ROLLBOX_HOME may be set, default /var/tmp/rollbox-test, the test suite's home where the
task's baseline is cached). Records go to a temporary SQLite file. Writes
``benchmarks/results/env.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _stats import stats_ms  # benchmarks/_stats.py
from rollbox.config import Home
from rollbox.env import AsyncTaskEnv
from rollbox.sandbox import AsyncSandbox

RESULTS = Path(__file__).parent / "results" / "env.json"
TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "hello-file"


async def step_overhead(home: Home, db: str, steps: int) -> dict[str, Any]:
    env = await AsyncTaskEnv.create(TASK, db=db, home=home, caller="bench")
    try:
        await env.reset()
        sbx = env.sandbox
        wd = env.task.environment.workdir
        via_env: list[float] = []
        bare: list[float] = []
        for i in range(steps):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for which in order:
                t0 = time.perf_counter()
                if which == 0:
                    await env.step("true")
                    via_env.append(time.perf_counter() - t0)
                else:
                    await sbx.exec(["bash", "-c", "true"], cwd=wd)
                    bare.append(time.perf_counter() - t0)
    finally:
        await env.close()
    e, b = stats_ms(via_env, 3), stats_ms(bare, 3)
    return {
        "env_step": e,
        "bare_exec": b,
        "overhead_p50_ms": round(e["p50_ms"] - b["p50_ms"], 3),
    }


async def timed(coro: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await coro
    return time.perf_counter() - t0, out


async def resets(home: Home, db: str, n: int) -> tuple[list[float], float]:
    tmpl = await AsyncTaskEnv.create(TASK, db=db, home=home, caller="bench")
    envs = [tmpl] + [
        AsyncTaskEnv(
            tmpl.task,
            home,
            type(tmpl.meta)(tmpl.meta.url, home=home),
            tmpl.blobs,
            backend="namespace",
            baseline=tmpl.baseline,
            seed=None,
            caller="bench",
            owns_meta=True,
        )
        for _ in range(n - 1)
    ]
    t0 = time.perf_counter()
    done = await asyncio.gather(*(timed(e.reset()) for e in envs))
    wall = time.perf_counter() - t0
    await asyncio.gather(*(e.close() for e in envs))
    return [d for d, _ in done], wall


async def creates(home: Home, baseline: str, n: int) -> tuple[list[float], float]:
    from rollbox.rollouts.tasks import load_task

    task = load_task(TASK)
    kw: dict[str, Any] = {
        "backend": "namespace",
        "limits": task.limits(),
        "network": task.network(),
        "workdir": task.environment.workdir,
        "home": home,
    }
    t0 = time.perf_counter()
    done = await asyncio.gather(*(timed(AsyncSandbox.create(baseline, **kw)) for _ in range(n)))
    wall = time.perf_counter() - t0
    await asyncio.gather(*(s.destroy() for _, s in done))
    return [d for d, _ in done], wall


def summary(lat: list[float], walls: list[float], n: int) -> dict[str, Any]:
    return {
        **stats_ms(lat),
        "throughput_per_s": round(n * len(walls) / sum(walls), 2),
        "wall_s": [round(w, 3) for w in walls],
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    home = Home(Path(os.environ.get("ROLLBOX_HOME", "/var/tmp/rollbox-test"))).ensure()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/env.db"
        load0 = os.getloadavg()[0]
        step = await step_overhead(home, db, args.steps)
        baseline = (await AsyncTaskEnv.create(TASK, db=db, home=home)).baseline
        r_lat: list[float] = []
        c_lat: list[float] = []
        r_wall: list[float] = []
        c_wall: list[float] = []
        for i in range(args.rounds):  # alternating order: load changes hit both alike
            for which in ("r", "c") if i % 2 == 0 else ("c", "r"):
                if which == "r":
                    lat, wall = await resets(home, db, args.envs)
                    r_lat += lat
                    r_wall.append(wall)
                else:
                    lat, wall = await creates(home, baseline, args.envs)
                    c_lat += lat
                    c_wall.append(wall)
        out = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "load_avg": {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)},
            "steps": step,
            "concurrent": {
                "n": args.envs,
                "rounds": args.rounds,
                "env_reset": summary(r_lat, r_wall, args.envs),
                "bare_create": summary(c_lat, c_wall, args.envs),
            },
        }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
