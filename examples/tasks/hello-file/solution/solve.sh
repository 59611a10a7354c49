#!/bin/bash
echo 'Hello, rollbox!' > /app/hello.txt
