#!/bin/bash
got=$(python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8765/hello.txt", timeout=5).read().decode().strip())')
if [ "$got" = "hello from the agent" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
