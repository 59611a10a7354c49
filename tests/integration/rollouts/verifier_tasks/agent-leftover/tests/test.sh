#!/bin/bash
# Reward 1 only when no process named rbx-leftover (argv[0]) is alive.
left=0
for f in /proc/[0-9]*/cmdline; do
    IFS= read -r -d '' argv0 < "$f" 2>/dev/null || continue
    [ "$argv0" = rbx-leftover ] && left=$((left + 1))
done
echo "leftover processes: $left"
if [ "$left" = 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
