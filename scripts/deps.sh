#!/usr/bin/env bash
# Installs the Debian packages nas needs to build, test and run its demo.
# Idempotent: asks dpkg first and calls apt-get only for what is missing, so a
# second run on a ready machine takes well under a second.
set -euo pipefail

packages=(
  build-essential pkg-config
  libgsl-dev libopenblas-dev libnlopt-dev
  libcmocka-dev libpq-dev libsqlite3-dev libyaml-dev libcurl4-openssl-dev libjansson-dev libmicrohttpd-dev
  sqlite3 python3 openssl curl
  libjs-chart.js # Chart.js, built into bin/nas for the dashboard (serve/assets.c)
  go-md2man # the man page of `make install` and `make deb` (a 2 MB Go binary; pandoc is 170 MB)
)
# Extra groups, asked for by the targets that need them.
for group in "$@"; do
  case "$group" in
    postgres) packages+=(postgresql-15) ;;
    slurm)    packages+=(slurm-wlm munge) ;;
    datasets) packages+=(dataset-fashion-mnist) ;;
    bench)    packages+=(python3-optuna python3-torch) ;;
    fuzz)     packages+=(clang libclang-rt-14-dev) ;;  # libFuzzer's runtime is in the latter
    browser)  packages+=(chromium) ;;  # the dashboard's end-to-end test (tests/test_e2e_dashboard.c)
    *) echo "deps.sh: unknown package group '$group' (expected postgres, slurm, datasets, bench, fuzz or browser)" >&2; exit 2 ;;
  esac
done

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "deps.sh: missing packages: ${missing[*]}" >&2
  echo "deps.sh: run as root (or: sudo apt-get install -y ${missing[*]})" >&2
  exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
