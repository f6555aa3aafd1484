#!/usr/bin/env bash
# Installs the Debian packages that provide missing tools, as root (apt-get); used by
# scripts/demo.sh and .ci/run so a fresh machine needs nothing done by hand.
#
#   scripts/install-tools.sh TOOL:PACKAGE ...     (a TOOL that is a path is checked with -e)
#
# Exits 0 when every tool is there afterwards; otherwise prints which are missing and why they
# could not be installed, and exits 1.
set -euo pipefail

present() { if [[ "$1" == /* ]]; then [ -e "$1" ]; else command -v "$1" >/dev/null 2>&1; fi; }

missing=()
for pair in "$@"; do
  present "${pair%%:*}" || missing+=("${pair##*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
# One package may provide several tools.
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing ${packages[*]}: install them (Debian: apt-get install ${packages[*]}) as root" >&2
  exit 1
fi
echo "installing ${packages[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
still=()
for pair in "$@"; do
  present "${pair%%:*}" || still+=("${pair%%:*}")
done
if [ ${#still[@]} -gt 0 ]; then
  echo "still missing after apt-get install: ${still[*]}" >&2
  exit 1
fi
