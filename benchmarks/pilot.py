"""Pilot and audit per backend on this machine; writes benchmarks/results/{pilot,audit}-*.json.

Usage (as root)::

    .venv/bin/python benchmarks/pilot.py                 # namespace, gvisor, microvm
    .venv/bin/python benchmarks/pilot.py --quick         # small scale (smoke)
    .venv/bin/python benchmarks/pilot.py --backends namespace --skip-audit

Each pilot level times the raw tool (bwrap / runsc) doing the same bare start in the same
run, so the ratios are measured side by side. The commands run are recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ROLLBOX = str(Path(sys.executable).parent / "rollbox")

FULL = {
    "namespace": {"rollouts": 200, "concurrency": "1,4,16", "cycles": 1000},
    "gvisor": {"rollouts": 50, "concurrency": "1,4,16", "cycles": 200},
    # TCG: fewer rollouts (a restore is ~0.3 s, a cold boot of a new shape seconds)
    "microvm": {"rollouts": 16, "concurrency": "1,4", "cycles": 1000},
}
QUICK = {
    "namespace": {"rollouts": 20, "concurrency": "1,4", "cycles": 20},
    "gvisor": {"rollouts": 8, "concurrency": "1,4", "cycles": 10},
    "microvm": {"rollouts": 2, "concurrency": "1,2", "cycles": 2},
}


def run(argv: list[str], home: str) -> tuple[dict[str, object], float, int]:
    env = {**os.environ, "ROLLBOX_HOME": home}
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    try:
        doc: dict[str, object] = json.loads(r.stdout)
    except json.JSONDecodeError:
        doc = {"error": (r.stdout + r.stderr)[-2000:]}
    return doc, wall, r.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="namespace,gvisor,microvm")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-audit", action="store_true")
    ap.add_argument("--skip-pilot", action="store_true")
    ap.add_argument("--home", default=os.environ.get("ROLLBOX_HOME", "/var/tmp/rbx-bench-pilot"))
    args = ap.parse_args()
    scale = QUICK if args.quick else FULL
    RESULTS.mkdir(parents=True, exist_ok=True)
    rc = 0
    for backend in args.backends.split(","):
        s = scale[backend]
        if not args.skip_pilot:
            png = RESULTS / f"pilot-{backend}.png"
            argv = [
                ROLLBOX, "pilot", "--backend", backend, "--rollouts", str(s["rollouts"]),
                "--concurrency", str(s["concurrency"]), "--plot", str(png), "--json",
            ]  # fmt: skip
            doc, wall, code = run(argv, args.home)
            out = {"command": " ".join(["rollbox", *argv[1:]]), "wall_s": round(wall, 2),
                   "exit_code": code, "report": doc}  # fmt: skip
            (RESULTS / f"pilot-{backend}.json").write_text(json.dumps(out, indent=1) + "\n")
            print(f"pilot {backend}: exit {code}, {wall:.1f} s")
            rc |= code
        if not args.skip_audit:
            argv = [ROLLBOX, "audit", "--backend", backend, "--cycles", str(s["cycles"]), "--json"]
            doc, wall, code = run(argv, args.home)
            out = {"command": " ".join(["rollbox", *argv[1:]]), "wall_s": round(wall, 2),
                   "exit_code": code, "report": doc}  # fmt: skip
            (RESULTS / f"audit-{backend}.json").write_text(json.dumps(out, indent=1) + "\n")
            print(f"audit {backend}: exit {code}, {wall:.1f} s, breaches {doc.get('breaches')}")
            rc |= code
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
