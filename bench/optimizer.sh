#!/usr/bin/env bash
# bench/optimizer.sh: `make bench-optimizer` (BENCH.md section 1): nas's gp, sobol and random
# against Optuna 3.1's TPE and NSGA-II on BraninCurrin, ZDT1, DTLZ2 (M = 2, 3), DTLZ7 (a front
# in pieces), C2-DTLZ2 (constrained) and a noisy BraninCurrin (the last two at the protocol
# of BoTorch's tutorials), then the time of one gp suggestion at 50, 100, 200 and 500
# observations, in DTLZ2's 6-d space and in wide ones (20, 40 floats; 40 floats with
# categoricals and ints).
#
# Knobs (environment): SEEDS (default 10), Q (default 1,4; the tutorial problems keep their
# own), PROBLEMS (default all seven),
# METHODS (nas methods, default gp,gp-ref,gp-follow,sobol,random; gp-ref is gp told the
# reference point as objective thresholds, gp-follow gp with `reference: follow`; gp-noise,
# gp told the noise, and gp-noise-ref, told both as the BoTorch tutorial's optimizer is, only
# differ from gp and gp-ref on BraninCurrinNoisy), OPTUNA_METHODS (default tpe,nsga2), OUT
# (folder for the CSV files, default a fresh temporary one), TIMING=0 to skip the timing.
# The quality runs of nas and of Optuna go side by side (one core each); the timing runs
# alone afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SEEDS=${SEEDS:-10}
Q=${Q:-1,4}
PROBLEMS=${PROBLEMS:-BraninCurrin,ZDT1,DTLZ2_M2,DTLZ2_M3,DTLZ7,C2DTLZ2,BraninCurrinNoisy}
METHODS=${METHODS:-gp,gp-ref,gp-follow,sobol,random}
OPTUNA_METHODS=${OPTUNA_METHODS:-tpe,nsga2}
OUT=${OUT:-$(mktemp -d)}
bin=$BUILD/bench/bench_optimizer

if ! /usr/bin/python3 -c 'import optuna' 2>/dev/null; then
  echo "bench/optimizer.sh: Optuna missing: run scripts/deps.sh bench (python3-optuna)" >&2
  exit 1
fi
mkdir -p "$OUT"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); seeds: $SEEDS; q: $Q; CSV files in $OUT"

"$bin" run --seeds "$SEEDS" --q "$Q" --methods "$METHODS" --problems "$PROBLEMS" >"$OUT/nas.csv" &
nas_pid=$!
/usr/bin/python3 -W ignore bench/optuna_problems.py --seeds "$SEEDS" --q "$Q" \
  --methods "$OPTUNA_METHODS" --problems "$PROBLEMS" >"$OUT/optuna.csv" 2>"$OUT/optuna.log"
wait "$nas_pid"

echo
echo "log10(max HV - HV of the evaluations so far), mean ± std over seeds, after N evaluations"
echo "(end: at the problem's budget; far tip: runs that reached the tip of DTLZ7's far piece):"
"$bin" table "$OUT/nas.csv" "$OUT/optuna.csv"
echo
cat "$OUT/optuna.log"
if [ "${TIMING:-1}" != 0 ]; then
  echo
  echo "time of one gp suggestion (q = 1) after random observations: DTLZ2 M = 2, d = 6, then"
  echo "20 and 40 floats, and 40 floats + 5 categoricals + 5 ints (65 cube dimensions):"
  "$bin" timing --spaces 6,20,40,mixed
fi
