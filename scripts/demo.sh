#!/usr/bin/env bash
# make demo: build the default baseline, run the example tasks in parallel, print the report.
set -euo pipefail
cd "$(dirname "$0")/.."
R=.venv/bin/rollbox
echo "== default baseline"
$R baseline default
