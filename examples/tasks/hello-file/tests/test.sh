#!/bin/bash
# Reward 1 when /app/hello.txt holds exactly the expected line.
if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, rollbox!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "hello.txt missing or wrong: $(head -c 100 /app/hello.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
