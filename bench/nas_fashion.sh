#!/usr/bin/env bash
# bench/nas_fashion.sh: `make bench-nas-fashion` (issue 19, "Benchmark"): the built-in NAS on
# full Fashion-MNIST (54 000 training / 6 000 validation images; the 10 000 test images
# reported, never searched on) with a mobile (`model: mobilenet`) or residual (`model:
# resnet`) search space, under a wall-time budget per run, comparing `gp`, `gp` with
# Hyperband (multi_fidelity) and `random`. Objectives: validation accuracy and params, or
# with OBJECTIVES=3 latency p50 too. Prints per run the trials, the hypervolume and the
# wall time; the front of every run together with its test accuracy beside the
# hand-designed rows of the dataset's README; best-so-far hypervolume against wall time per
# method; and the per-trial time split (data setup, training with its per-epoch validation,
# the rest of the trial: latency, test evaluation, saving, start-up; the scheduler's gap
# between trials).
#
# Knobs (environment):
#   FAMILY      mobilenet (default) | resnet | cnn. The mobilenet and resnet spaces use the
#               families of issue 19 (`model: mobilenet` / `model: resnet`); cnn is the
#               fallback for a build without them.
#   METHODS     default gp,gp+hyperband,random (an optimizer type; +hyperband adds
#               multi_fidelity: Hyperband from MIN_EPOCHS to EPOCHS)
#   SEEDS       default 0,1
#   BUDGET      wall seconds per run (budget.wall_time), default 7200 (2 h)
#   PARALLEL    default 2
#   OBJECTIVES  2 (accuracy, params; default) or 3 (and latency_ms_p50)
#   EPOCHS      epochs of a trial of gp and random (default 9); Hyperband's max_epochs too
#   MIN_EPOCHS, ETA   Hyperband's (default 1 and 3)
#   SETTINGS    extra trial.builtin settings, e.g. "limit_train: 10000" for a reduced run
#   TRIALS      trial budget per run (default 1000: the wall time decides)
#   NAS (the binary, default bin/nas), OUT (folder for storage, runs and specs; default a
#   fresh one).
set -euo pipefail
cd "$(dirname "$0")/.."
FAMILY=${FAMILY:-mobilenet}
METHODS=${METHODS:-gp,gp+hyperband,random}
SEEDS=${SEEDS:-0,1}
BUDGET=${BUDGET:-7200}
PARALLEL=${PARALLEL:-2}
OBJECTIVES=${OBJECTIVES:-2}
EPOCHS=${EPOCHS:-9}
MIN_EPOCHS=${MIN_EPOCHS:-1}
ETA=${ETA:-3}
SETTINGS=${SETTINGS:-}
TRIALS=${TRIALS:-1000}
NAS=$(realpath "${NAS:-bin/nas}")
OUT=${OUT:-$(mktemp -d)}

if [ ! -d /usr/share/datasets/fashion-mnist ] && [ -z "${NAS_DATA_DIR:-}" ]; then
  echo "bench/nas_fashion.sh: Fashion-MNIST missing: apt-get install dataset-fashion-mnist" >&2
  exit 1
fi
mkdir -p "$OUT"

# The stages, widths and depths both residual families search (2 or 3 stages), then the
# learning rate and flips; $1 is the most blocks a later stage may have.
residual_space() {
  cat <<EOF
  stages: {type: int, low: 2, high: 3}
  channels1: {type: int, low: 8, high: 32, log: true}
  channels2: {type: int, low: 16, high: 64, log: true}
  channels3: {type: int, low: 24, high: 96, log: true, when: "stages >= 3"}
  blocks1: {type: int, low: 1, high: 2}
  blocks2: {type: int, low: 1, high: $1}
  blocks3: {type: int, low: 1, high: $1, when: "stages >= 3"}
  lr: {type: float, low: 1e-3, high: 1e-2, log: true}
  augment_flip: {type: categorical, choices: [true, false]}
EOF
}

# The search space of each family (trial.builtin settings searched as parameters).
space() {
  case $FAMILY in
  mobilenet) # inverted residual blocks (the mobilenet family, docs/spec.md)
    residual_space 3
    cat <<'EOF'
  expansion: {type: int, low: 2, high: 6}
  kernel2: {type: categorical, choices: [3, 5]}
  kernel3: {type: categorical, choices: [3, 5], when: "stages >= 3"}
  se2: {type: categorical, choices: [true, false]}
  se3: {type: categorical, choices: [true, false], when: "stages >= 3"}
  activation: {type: categorical, choices: [relu, hardswish]}
EOF
    ;;
  resnet) # basic residual blocks (the resnet family, docs/spec.md)
    residual_space 2
    ;;
  cnn) # the fallback: the plain CNN family
    cat <<'EOF'
  stages: {type: int, low: 1, high: 3}
  channels1: {type: int, low: 4, high: 48, log: true}
  channels2: {type: int, low: 4, high: 64, log: true, when: "stages >= 2"}
  channels3: {type: int, low: 4, high: 64, log: true, when: "stages >= 3"}
  kernel: {type: categorical, choices: [3, 5]}
  head_width: {type: categorical, choices: [0, 32, 128]}
  norm: {type: categorical, choices: [none, batch]}
  lr: {type: float, low: 3e-4, high: 1e-2, log: true}
EOF
    ;;
  *) echo "bench/nas_fashion.sh: FAMILY must be mobilenet, resnet or cnn, not '$FAMILY'" >&2
     exit 2 ;;
  esac
}

# One spec per method and seed.
write_spec() {
  local method=$1 seed=$2 name=$3 optimizer=${1%+hyperband}
  {
    echo "name: $name"
    echo "seed: $seed"
    echo "parameters:"
    space
    echo "objectives:"
    echo "  - {name: accuracy, goal: maximize, threshold: 0.8}"
    echo "  - {name: params, goal: minimize, threshold: 100000}"
    if [ "$OBJECTIVES" = 3 ]; then
      echo "  - {name: latency_ms_p50, goal: minimize, threshold: 5}"
    fi
    echo "trial:"
    echo "  builtin: {model: $FAMILY, dataset: fashion-mnist, epochs: $EPOCHS, batch_size: 64,"
    echo "            optimizer: adam, schedule: cosine${SETTINGS:+, $SETTINGS}}"
    echo "  timeout: 2h"
    echo "budget: {trials: $TRIALS, parallel: $PARALLEL, wall_time: $BUDGET}"
    echo "optimizer: {type: $optimizer}"
    if [ "$method" != "$optimizer" ]; then
      echo "multi_fidelity: {kind: hyperband, min_epochs: $MIN_EPOCHS, max_epochs: $EPOCHS, eta: $ETA}"
    fi
  } >"$OUT/$name.yaml"
}

run_one() {
  local method=$1 seed=$2 name="fashion-$FAMILY-${1/+/-}-$2"
  write_spec "$method" "$seed" "$name"
  local start=$(date +%s.%N)
  (cd "$OUT" && "$NAS" run "$name.yaml" --storage "sqlite:$OUT/nas.db" --no-progress \
     2>"$OUT/$name.log") || true # the wall-time budget ends a run as stopped
  local end=$(date +%s.%N)
  echo "$method $seed $name $start $end" >>"$OUT/runs.txt"
  echo "  $method seed $seed: $(tail -n 1 "$OUT/$name.log" | sed 's/^nas: //')"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); family: $FAMILY; objectives: $OBJECTIVES; budget:" \
     "$BUDGET s per run; parallel: $PARALLEL; epochs: $EPOCHS (hyperband $MIN_EPOCHS..$EPOCHS," \
     "eta $ETA); seeds: $SEEDS; extra settings: ${SETTINGS:-none}; load before: $(cut -d' ' -f1-3 /proc/loadavg);" \
     "files in $OUT"
: >"$OUT/runs.txt"
for seed in ${SEEDS//,/ }; do
  for method in ${METHODS//,/ }; do run_one "$method" "$seed"; done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
/usr/bin/python3 bench/nas_fashion_report.py "$OUT" "$OBJECTIVES" "$PARALLEL"
