#!/usr/bin/env bash
# Install what rollbox needs on a Debian 12 host, as root. Idempotent and quick when done:
# apt runs only when a package is missing; pip runs only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(bubblewrap runc runsc qemu-system-x86 qemu-utils buildah skopeo umoci mmdebstrap
  busybox-static cpio e2fsprogs socat docker-registry postgresql iptables iproute2 kmod
  libseccomp2 gcc libc6-dev python3-venv procps psmisc util-linux)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  # docker-registry and postgresql start services on install; tests start their own.
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.rollbox-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing rollbox and its dependencies into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import rollbox, typer, sqlalchemy' # fail loudly if the install failed
  touch "$stamp"
fi
