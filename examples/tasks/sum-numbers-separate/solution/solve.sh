#!/bin/bash
python3 -c "print(sum(int(l) for l in open('/app/numbers.txt') if l.strip()))" > /app/sum.txt
