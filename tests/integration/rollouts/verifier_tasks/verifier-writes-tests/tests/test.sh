#!/bin/bash
# Importing helper.py writes /tests/__pycache__/helper.*.pyc, as pytest does for test files.
cd /tests
python3 -c 'import helper; assert helper.ANSWER == 42' && ls __pycache__/helper.*.pyc >/dev/null \
    && echo 1 > /logs/verifier/reward.txt
