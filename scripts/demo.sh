#!/usr/bin/env bash
# make demo: build the default baseline, run every example task with the oracle agent,
# 4 attempts each, in parallel on the default backend (auto), and print the report.
# Then show that the provenance of the run verifies and export it as JSONL.
set -euo pipefail
cd "$(dirname "$0")/.."
R=.venv/bin/rollbox
echo "== default baseline"
$R baseline default
echo
echo "== rollbox run examples/tasks/* --agent oracle --attempts 4"
$R run examples/tasks/* --agent oracle --attempts 4 --concurrency "${DEMO_CONCURRENCY:-4}" \
  --backend "${DEMO_BACKEND:-auto}"
run_id=$($R runs ls --json | .venv/bin/python -c '
import json, sys
doc = json.load(sys.stdin)
runs = doc if isinstance(doc, list) else doc.get("runs", [])
print(max(runs, key=lambda r: r["created_at"])["id"])')
echo
echo "== rollbox verify $run_id"
$R verify "$run_id"
out="${TMPDIR:-/tmp}/rollbox-demo-$run_id.jsonl"
$R export "$run_id" -o "$out"
