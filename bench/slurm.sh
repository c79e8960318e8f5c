#!/usr/bin/env bash
# make bench-slurm: scheduler overhead per trial on Slurm against the local runner.
#
# TRIALS trivial trials (default 100), PARALLEL at once (default 8), random search, SQLite,
# run by bin/nas three times: runner local; runner slurm with its defaults; runner slurm
# with poll_interval 1. Slurm is a throwaway single-node cluster (scripts/slurm-cluster.sh:
# root, Debian slurm-wlm and munge; its node offers 16 CPUs, so 8 trials fit at once).
# Each trial prints the time it began to run as a metric (t_run), so storage holds, per
# trial:
#   submit -> running   = t_run - started_at  (started_at: the job is submitted and stored)
#   running -> recorded = finished_at - t_run (finished_at: the end is stored)
# and the table gives their mean and p95, the wall time, and the wall time per trial.
# A last row measures Slurm alone: BARE jobs (default 20) submitted with plain
# `sbatch --wrap`, from just before sbatch to the moment the job runs.
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${TRIALS:-100}
parallel=${PARALLEL:-8}
bin=$(pwd)/bin
work=$(mktemp -d)
chmod 755 "$work" # munged, running as munge, must reach the cluster's folder inside
mkdir "$work/cluster"
cleanup() {
  scripts/slurm-cluster.sh stop "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
conf=$(scripts/slurm-cluster.sh start "$work/cluster")
eval "$conf" # export SLURM_CONF=…

# spec NAME RUNNER: writes $work/NAME.yaml
spec() {
  cat >"$work/$1.yaml" <<YAML
name: $1
parameters: {x: {type: float, low: 0, high: 1}}
objectives: [{name: y, goal: minimize}]
trial: {command: [sh, -c, 'echo "nas-metric {{\"y\": {x}, \"t_run\": \$(date +%s.%N)}}"']}
budget: {trials: $trials, parallel: $parallel}
runner: $2
optimizer: {type: random}
YAML
}

# run NAME: runs the experiment, prints one table row
run() {
  local name=$1 start wall
  start=$(date +%s.%N)
  (cd "$work" && "$bin/nas" run "$name.yaml" --storage "sqlite:$work/$name.db" --no-progress \
    >/dev/null 2>"$work/$name.err") || { cat "$work/$name.err" >&2; exit 1; }
  wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  python3 - "$work/$name.db" "$name" "$wall" "$trials" <<'PY'
import sqlite3, sys
db, name, wall, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
rows = sqlite3.connect(db).execute(
    "SELECT t.started_at, m.value, t.finished_at FROM trials t JOIN metrics m"
    " ON m.trial_id = t.id AND m.name = 't_run' WHERE t.status = 'completed'").fetchall()
def stats(xs):
    xs = sorted(xs)
    return sum(xs) / len(xs) * 1000, xs[min(len(xs) - 1, int(0.95 * len(xs)))] * 1000
run_ms = stats([r - s for s, r, f in rows])
rec_ms = stats([f - r for s, r, f in rows])
print(f"| {name} | {len(rows)}/{n} | {run_ms[0]:.0f} / {run_ms[1]:.0f} | "
      f"{rec_ms[0]:.0f} / {rec_ms[1]:.0f} | {wall:.1f} | {wall / n * 1000:.0f} |")
PY
}

# Slurm's own latency from sbatch to a running job, without nas.
bare() {
  local n=${BARE:-20} i
  mkdir "$work/bare"
  for i in $(seq "$n"); do
    date +%s.%N >"$work/bare/$i.submit"
    sbatch --parsable -o /dev/null --wrap "date +%s.%N >$work/bare/$i.run" >/dev/null
  done
  for i in $(seq "$n"); do
    until [[ -s $work/bare/$i.run ]]; do sleep 0.05; done
  done
  python3 - "$work/bare" "$n" <<'PY'
import sys
d, n = sys.argv[1], int(sys.argv[2])
xs = sorted(float(open(f"{d}/{i}.run").read()) - float(open(f"{d}/{i}.submit").read())
            for i in range(1, n + 1))
print(f"| plain sbatch, no nas | {n}/{n} | {sum(xs) / n * 1000:.0f} / "
      f"{xs[min(n - 1, int(0.95 * n))] * 1000:.0f} | | | |")
PY
}

spec local "{type: local}"
spec slurm "{type: slurm}"
spec slurm_poll1 "{type: slurm, poll_interval: 1}"

echo "$trials trivial trials, parallel $parallel; times in ms (mean / p95) unless marked"
echo
echo "| runner | completed | submit → running | running → recorded | wall (s) | wall per trial |"
echo "|---|---|---|---|---|---|"
run local
run slurm
run slurm_poll1
bare
