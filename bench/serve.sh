#!/bin/sh
# bench/serve.sh: `make bench-serve` — the storage benchmark (bench/bench_storage.c) on
# SQLite directly and through a `nas serve` in front of the same kind of SQLite file (the
# http storage backend: libcurl, one keep-alive connection per process, idempotency keys),
# in one run so the two sit side by side: reports per second with 1, 8 and 32 processes,
# one observation and 64 observations per request, p50/p99 latency of each request, and
# trial_claim latency; then the same on a throwaway PostgreSQL (tests/pgserver.h, durable
# commits), directly and through a `nas serve` in front of it (http-pg). SECONDS_PER_RUN,
# CLAIM_TRIALS and BACKENDS as for bench-storage.
set -eu
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
BACKENDS=${BACKENDS:-sqlite,http,postgresql,http-pg} NAS_BIN=${NAS_BIN:-$(pwd)/$BIN/nas} \
  exec "$BUILD/bench/bench_storage"
