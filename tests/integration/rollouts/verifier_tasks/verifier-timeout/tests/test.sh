#!/bin/bash
# Writes a log, leaves a daemon, then hangs past [verifier] timeout_sec.
echo started > /logs/verifier/progress.log
setsid sleep 300 </dev/null >/dev/null 2>&1 &
sleep 300
echo 1 > /logs/verifier/reward.txt
