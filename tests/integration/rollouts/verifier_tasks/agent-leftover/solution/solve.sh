#!/bin/bash
# Two trees left behind: a setsid sleeper and a loop that keeps forking.
setsid bash -c 'exec -a rbx-leftover sleep 1000' </dev/null >/dev/null 2>&1 &
setsid bash -c 'exec -a rbx-leftover bash -c "while :; do sleep 0.01; done"' </dev/null >/dev/null 2>&1 &
sleep 0.2
