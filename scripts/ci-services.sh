#!/usr/bin/env bash
# Start the services the test suite talks to: a PostgreSQL cluster on loopback.
# Idempotent. Prints the URL to use as ROLLBOX_TEST_PG_URL.
set -euo pipefail
ver=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -1)
[ -n "$ver" ] || { echo "ci-services: postgresql is not installed (run make setup)" >&2; exit 1; }
if ! pg_lsclusters -h 2>/dev/null | grep -q "^$ver main"; then
  pg_createcluster "$ver" main >/dev/null
fi
pg_ctlcluster "$ver" main start >/dev/null 2>&1 || true
for _ in $(seq 1 50); do
  pg_isready -q -h 127.0.0.1 && break
  sleep 0.2
done
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='rollbox'\"" | grep -q 1 \
  || su postgres -c "psql -qc \"CREATE ROLE rollbox LOGIN SUPERUSER PASSWORD 'rollbox'\""
echo "postgresql+psycopg://rollbox:rollbox@127.0.0.1:5432/"
