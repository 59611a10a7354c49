#!/bin/bash
# Gives the writer time, then crashes before writing any reward.
sleep 1
echo "test.sh: crashing before the reward" >&2
exit 3
