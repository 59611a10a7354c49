#!/bin/bash
# Forge: a writer left running (own session, detached) that keeps the reward at 1.
setsid bash -c 'while :; do
    mkdir -p /logs/verifier
    echo 1 > /logs/verifier/reward.txt
    sleep 0.005
done' </dev/null >/dev/null 2>&1 &
sleep 0.2
