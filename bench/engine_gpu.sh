#!/usr/bin/env bash
# bench-engine-gpu (issue 21): the engine against PyTorch eager on CUDA device 0, in one run.
# Runs $BUILD/bench/bench_engine --device cuda and bench/engine_torch.py --device cuda at each
# batch of BATCHES (default "128 1024"), and the training of MLP 784-4096-4096-10 at batch
# 1024 (`--model wide`), ROUNDS times interleaved (default 3), and prints one markdown table of
# the best of each: training samples/s, batch-1 inference latency and a 4096^3 float32
# matmul, with the engine/PyTorch ratios. Both sides compute in float32 (TF32
# off, see engine_torch.py). PYTHON names the interpreter that has PyTorch with CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bin=$BUILD/bench/bench_engine
py=${PYTHON:-python3}
rounds=${ROUNDS:-3}
batches=${BATCHES:-128 1024}
[ -x "$bin" ] || {
  echo "engine_gpu.sh: $bin is missing (make bench-engine-gpu builds it)" >&2; exit 1; }
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
  echo "engine_gpu.sh: $py has no PyTorch with a usable CUDA device" >&2; exit 1; }

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
run() { # side, batch, then the command; prefixes every "key value" line with both
  local side=$1 batch=$2; shift 2
  "$@" | sed "s/^/$side $batch /" >>"$raw"
}
for _ in $(seq "$rounds"); do
  for b in $batches; do
    run engine "$b" "$bin" --device cuda --batch "$b"
    run torch "$b" "$py" bench/engine_torch.py 1 --device cuda --batch "$b"
  done
  run engine 1024 "$bin" --device cuda --batch 1024 --model wide
  run torch 1024 "$py" bench/engine_torch.py 1 --device cuda --batch 1024 --model wide
done

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "device: $gpu;" \
  "host: $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
echo "torch: $(grep -m1 ' torch_version ' "$raw" | cut -d' ' -f4); rounds: $rounds (best of each)"
"$py" - "$raw" <<'PY'
import sys
higher = ("mlp_train_samples_per_s", "cnn_train_samples_per_s", "wide_train_samples_per_s")
lower = ("mlp_infer_p50_us", "mlp_infer_p99_us", "cnn_infer_p50_us", "cnn_infer_p99_us")
best = {}  # (side, batch, key) -> best value over the rounds
for line in open(sys.argv[1]):
    side, batch, key, value = line.split()
    if key in higher + lower or key.startswith("sgemm_"):
        v, k = float(value), (side, int(batch), key)
        old = best.get(k)
        if old is None or (v < old if key in lower else v > old):
            best[k] = v
print("| batch | metric | engine | PyTorch eager | engine / PyTorch |")
print("|---|---|---|---|---|")
for batch in sorted({b for _, b, _ in best}):
    rows = [(k, k) for k in higher + lower] + [("sgemm 4096^3 GFLOP/s", None)]
    for label, key in rows:
        e = best.get(("engine", batch, key or "sgemm_engine_gflops"))
        t = best.get(("torch", batch, key or "sgemm_torch_gflops"))
        if e is None or t is None:
            continue
        ratio = t / e if key in lower else e / t
        what = "x lower latency" if key in lower else "x throughput"
        print(f"| {batch} | {label} | {e:.1f} | {t:.1f} | {ratio:.2f}{what} |")
PY
