#!/bin/sh
# bench/serve.sh: `make bench-serve` — the storage benchmark (bench/bench_storage.c) on
# SQLite directly and through a `nas serve` in front of the same kind of SQLite file (the
# http storage backend: libcurl, one keep-alive connection per process, idempotency keys),
# in one run so the two sit side by side: reports per second with 1, 8 and 32 processes,
# one observation and 64 observations per request, p50/p99 latency of each request, and
# trial_claim latency. SECONDS_PER_RUN and CLAIM_TRIALS as for bench-storage.
set -eu
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
BACKENDS=${BACKENDS:-sqlite,http} NAS_BIN=${NAS_BIN:-$(pwd)/$BIN/nas} \
  exec "$BUILD/bench/bench_storage"
