#!/bin/bash
find /app -type f \( -name '*.key' -o -name '*.pem' \) -delete
