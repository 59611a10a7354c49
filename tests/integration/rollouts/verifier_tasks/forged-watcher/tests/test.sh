#!/bin/bash
sleep 1 # ORIGINAL-TESTS
echo 0 > /logs/verifier/reward.txt
