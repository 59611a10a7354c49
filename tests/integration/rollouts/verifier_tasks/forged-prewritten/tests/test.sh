#!/bin/bash
# Crashes before writing any reward: only a forged one could make this rollout pass.
echo "test.sh: crashing before the reward" >&2
exit 3
