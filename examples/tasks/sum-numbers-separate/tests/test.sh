#!/bin/bash
# Runs in a separate sandbox (snapshot of the agent's filesystem): no agent process survives.
got=$(tr -d ' \n' < /app/sum.txt 2>/dev/null)
echo "expected ${EXPECTED_SUM}, got '${got}'"
if [ "$got" = "$EXPECTED_SUM" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
