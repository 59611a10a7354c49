#!/bin/bash
# Reward 1 only when the file matches the expected one line for line.
if diff -u /tests/expected.conf /app/service.conf; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
