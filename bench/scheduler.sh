#!/usr/bin/env bash
# make bench-scheduler: orchestration overhead and crash recovery of bin/nas (BENCH.md §4).
#  1. N trivial trials (bin/branin_currin, which exits at once), local runner, SQLite,
#     parallel 2, random search: overhead per trial = (wall - ideal) / N, where ideal is the
#     trials' own run time (measured by running the same command N times in a row) / 2.
#  2. Recovery: kill -9 of `nas run` mid-experiment, then `nas resume`: seconds from the
#     kill to the first trial created by the resumed scheduler.
# Prints a table; set TRIALS to change N (default 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${TRIALS:-1000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$(pwd)/bin

cat >"$work/trivial.yaml" <<YAML
name: trivial
parameters: {x1: {type: float, low: 0, high: 1}, x2: {type: float, low: 0, high: 1}}
objectives: [{name: branin, goal: minimize}, {name: currin, goal: minimize}]
trial: {command: [$bin/branin_currin, "--x1={x1}", "--x2={x2}"]}
budget: {trials: $trials, parallel: 2}
optimizer: {type: random}
YAML

now() { date +%s.%N; }
# The trials' own cost: the same program, run N times in a row by a plain shell loop.
start=$(now)
for _ in $(seq "$trials"); do "$bin/branin_currin" --x1=0.5 --x2=0.5 >/dev/null; done
own=$(awk -v a="$start" -v b="$(now)" 'BEGIN { print b - a }')

start=$(now)
(cd "$work" && "$bin/nas" run trivial.yaml --storage "sqlite:$work/nas.db" --no-progress 2>/dev/null)
wall=$(awk -v a="$start" -v b="$(now)" 'BEGIN { print b - a }')

# Recovery: trials of 0.5 s, killed after 2 s of running.
cat >"$work/recover.yaml" <<YAML
name: recover
parameters: {x: {type: float, low: 0, high: 1}}
objectives: [{name: y, goal: minimize}]
trial: {command: [sh, -c, 'sleep 0.5; echo "nas-metric {{\"y\": {x}}}"']}
budget: {trials: 40, parallel: 2}
optimizer: {type: random}
YAML
(cd "$work" && exec "$bin/nas" run recover.yaml --storage "sqlite:$work/r.db" --no-progress 2>/dev/null) &
pid=$!
sleep 2
kill -9 "$pid"
killed=$(now)
wait "$pid" 2>/dev/null || true
(cd "$work" && "$bin/nas" resume recover --storage "sqlite:$work/r.db" --no-progress 2>/dev/null)
first=$(sqlite3 "$work/r.db" "SELECT min(created_at) FROM trials WHERE created_at > $killed")
completed=$(sqlite3 "$work/r.db" "SELECT count(*) FROM trials WHERE status = 'completed'")

printf '| measure | value |\n|---|---|\n'
printf '| trivial trials (parallel 2) | %d |\n' "$trials"
printf '| wall time | %.2f s |\n' "$wall"
printf '| trials'"'"' own run time, in a row | %.2f s |\n' "$own"
awk -v w="$wall" -v o="$own" -v n="$trials" 'BEGIN {
  ideal = o / 2
  printf "| ideal (own time / 2) | %.2f s |\n", ideal
  printf "| scheduler overhead per trial | %.2f ms |\n", (w - ideal) / n * 1000 }'
awk -v k="$killed" -v f="$first" 'BEGIN { printf "| kill -9 → first new trial after resume | %.3f s |\n", f - k }'
printf '| recovery run: completed of 40 | %d |\n' "$completed"
