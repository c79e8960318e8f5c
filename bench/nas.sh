#!/usr/bin/env bash
# bench/nas.sh: `make bench-nas` (BENCH.md section 3): the built-in NAS of
# examples/fashion-nas.yaml (Ax's multi-objective NAS tutorial on Fashion-MNIST: an MLP's two
# widths, learning rate, dropout, batch size and epochs; validation accuracy against
# parameters) searched by nas's gp and by random search at the same trial budget, several
# seeds each. Prints per run and per method the hypervolume (the spec's reference point),
# the front's size, the best accuracy and the wall time, then the front all gp runs found
# together beside the hand-designed models of the dataset's README.
#
# Knobs (environment): METHODS (default gp,random), SEEDS (default 0,1,2), TRIALS (default
# 30), PARALLEL (default 2), SPEC (default examples/fashion-nas.yaml), SETTINGS (extra
# settings for the builtin section, e.g. "limit_train: 20000" for a reduced run), NAS (the
# binary, default bin/nas), OUT (folder for storage, runs and specs; default a fresh one).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh datasets # Fashion-MNIST comes from Debian's dataset-fashion-mnist
METHODS=${METHODS:-gp,random}
SEEDS=${SEEDS:-0,1,2}
TRIALS=${TRIALS:-30}
PARALLEL=${PARALLEL:-2}
SPEC=${SPEC:-examples/fashion-nas.yaml}
SETTINGS=${SETTINGS:-}
NAS=$(realpath "${NAS:-bin/nas}")
OUT=${OUT:-$(mktemp -d)}
base=$(sed -n 's/^name: *//p' "$SPEC")

if [ ! -d /usr/share/datasets/fashion-mnist ] && [ -z "${NAS_DATA_DIR:-}" ]; then
  echo "bench/nas.sh: Fashion-MNIST missing: apt-get install dataset-fashion-mnist" >&2
  exit 1
fi
mkdir -p "$OUT"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); spec: $SPEC; trials: $TRIALS; parallel: $PARALLEL;" \
     "seeds: $SEEDS; extra settings: ${SETTINGS:-none}; files in $OUT"

# One copy of the spec per method and seed: its name, seed, budget and optimizer replaced.
run_one() {
  local method=$1 seed=$2 name="$base-$1-$2"
  local extra=${SETTINGS:+, $SETTINGS}
  sed -e "s/^name: .*/name: $name/" -e "s/^seed: .*/seed: $seed/" \
      -e "s/^budget: .*/budget: {trials: $TRIALS, parallel: $PARALLEL}/" \
      -e "s/^\(  builtin: {.*\)}$/\1$extra}/" "$SPEC" >"$OUT/$name.yaml"
  echo "optimizer: {type: $method}" >>"$OUT/$name.yaml"
  local start=$(date +%s.%N)
  (cd "$OUT" && "$NAS" run "$name.yaml" --storage "sqlite:$OUT/nas.db" --no-progress \
     2>"$OUT/$name.log")
  local end=$(date +%s.%N)
  "$NAS" pareto "$name" --storage "sqlite:$OUT/nas.db" --format json >"$OUT/$name.pareto.json"
  "$NAS" trials "$name" --storage "sqlite:$OUT/nas.db" --format json >"$OUT/$name.trials.json"
  awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f\n", e - s }' >"$OUT/$name.wall"
  echo "  $(tail -n 1 "$OUT/$name.log" | sed 's/^nas: //') ($(cat "$OUT/$name.wall") s)"
}

echo
for seed in ${SEEDS//,/ }; do
  for method in ${METHODS//,/ }; do run_one "$method" "$seed"; done
done

echo
/usr/bin/python3 - "$OUT" "$base" "$METHODS" "$SEEDS" <<'EOF'
import json, statistics, sys
out, base, methods, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")

def load(method, seed):
    name = f"{out}/{base}-{method}-{seed}"
    pareto = json.load(open(name + ".pareto.json"))
    trials = json.load(open(name + ".trials.json"))
    wall = float(open(name + ".wall").read())
    return pareto, trials, wall

print("| method | seed | hypervolume | front | best accuracy | completed | wall s |")
print("|---|---|---|---|---|---|---|")
summary = {}
for method in methods:
    for seed in seeds:
        pareto, trials, wall = load(method, seed)
        done = [t for t in trials if t["status"] == "completed"]
        best = max((t["accuracy"] for t in done), default=float("nan"))
        hv = pareto["hypervolume"]
        summary.setdefault(method, []).append((hv, wall))
        print(f"| {method} | {seed} | {hv:.1f} | {len(pareto['front'])} | {best:.4f} | "
              f"{len(done)}/{len(trials)} | {wall:.0f} |")
print()
print("| method | hypervolume, mean ± std | wall s, mean |")
print("|---|---|---|")
for method, runs in summary.items():
    hvs = [hv for hv, _ in runs]
    std = statistics.stdev(hvs) if len(hvs) > 1 else 0.0
    print(f"| {method} | {statistics.mean(hvs):.1f} ± {std:.1f} | "
          f"{statistics.mean(w for _, w in runs):.0f} |")

# The front of every gp trial together (accuracy up, params down).
pool = []
for seed in seeds:
    _, trials, _ = load(methods[0], seed)
    pool += [dict(t, seed=seed) for t in trials if t["status"] == "completed"]
front = [t for t in pool if not any(
    o["accuracy"] >= t["accuracy"] and o["params"] <= t["params"] and
    (o["accuracy"] > t["accuracy"] or o["params"] < t["params"]) for o in pool)]
front.sort(key=lambda t: t["params"])
print()
print(f"Front of all {methods[0]} runs together, beside hand-designed models "
      "(Fashion-MNIST README; their accuracy is test accuracy):")
print()
print("| model | params | val accuracy | test accuracy | latency p50 ms | epochs | batch | lr | dropout |")
print("|---|---|---|---|---|---|---|---|---|")
for t in front:
    test = t.get("test_accuracy")
    print(f"| nas MLP 784-{t['width1']}-{t['width2']}-10 (seed {t['seed']}, trial {t['trial']}) | "
          f"{int(t['params'])} | {t['accuracy']:.4f} | {test:.4f} | {t['latency_ms_p50']:.4f} | "
          f"{t['epochs']} | {t['batch_size']} | {t['lr']:.2g} | {t['dropout']:.2f} |")
for name, params, acc in [("MLP 256-128-100 (README)", "247 766", "0.8833"),
                          ("2 Conv <100K parameters (README)", "< 100 000", "0.925"),
                          ("2 Conv ~113K parameters (README)", "~113 000", "0.922"),
                          ("2 Conv+3 FC ~500K, augmentation, BN (README)", "~500 000", "0.934"),
                          ("DenseNet-BC (README)", "768 000", "0.954")]:
    print(f"| {name} | {params} | | {acc} | | | | | |")
EOF
