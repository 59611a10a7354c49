#!/bin/bash
if [ "$(tr -d ' \n' < /tmp/count.txt 2>/dev/null)" = "9" ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
