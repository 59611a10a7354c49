#!/bin/bash
# Reward: fraction of tests passing in reward.json, headline 1 only when all pass.
cd /tests
python3 -m pytest -q -p no:cacheprovider test_stats.py > /logs/verifier/pytest.log 2>&1
rc=$?
cat /logs/verifier/pytest.log
passed=$(grep -oE '[0-9]+ passed' /logs/verifier/pytest.log | grep -oE '[0-9]+' || echo 0)
total=4
reward=0
[ "$rc" -eq 0 ] && reward=1
printf '{"reward": %s, "tests_passed": %s}\n' "$reward" "$(python3 -c "print(${passed:-0}/$total)")" \
  > /logs/verifier/reward.json
