#!/bin/bash
left=$(find /app -name '*.key' -o -name '*.pem' | wc -l)
kept=0
[ -f /app/conf/app.conf ] && [ -f /app/certs/README ] && kept=1
echo "secrets left: $left, other files kept: $kept"
if [ "$left" -eq 0 ] && [ "$kept" -eq 1 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
