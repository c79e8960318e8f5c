#!/usr/bin/env bash
# Runs each cmocka test binary given on the command line, then sums their results into
# one closing "N passed, N failed" line. Exits non-zero when any test failed or any
# binary crashed.
set -u
passed=0 failed=0 broken=0
# Built-in trials keep a dataset cache (docs/spec.md); the suite's goes in a folder of its
# own, removed at the end, not in the user's ~/.cache/nas.
if [ -z "${NAS_CACHE_DIR:-}" ]; then
  NAS_CACHE_DIR=$(mktemp -d) && export NAS_CACHE_DIR
  trap 'rm -rf "$NAS_CACHE_DIR"' EXIT
fi
for bin in "$@"; do
  name=$(basename "$bin")
  log=$(mktemp)
  start=$(date +%s.%N)
  "$bin" >"$log" 2>&1
  rc=$?
  cat "$log"
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "run.sh: $name exited with status $rc without reporting a failed test" >&2
    broken=$((broken + 1))
  fi
  awk -v n="$name" -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "run.sh: %s took %.1f s\n", n, e - s }'
  rm -f "$log"
done
failed=$((failed + broken))
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
