#!/bin/bash
mkdir -p /srv
echo "hello from the agent" > /srv/hello.txt
setsid python3 -m http.server 8765 --bind 127.0.0.1 --directory /srv </dev/null >/dev/null 2>&1 &
# up before the agent step ends
for _ in $(seq 100); do
    python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8765), 1)' 2>/dev/null && exit 0
    sleep 0.1
done
exit 1
