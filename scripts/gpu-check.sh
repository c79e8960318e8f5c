#!/usr/bin/env bash
# The GPU checks of issue 21, on a machine with a GPU, from a checkout holding the bundle of
# scripts/gpu-bundle.sh: the five test binaries with GPU tests, a built-in trial with device: cuda end
# to end (the digits example, 4 trials), and bench/engine_gpu.sh (the engine against the
# machine's PyTorch; ROUNDS, default 3). Everything is also written under OUT (default
# /tmp/gpu-check). The exit status is the number of steps that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
start=$(date +%s)
step() { echo "[+$(($(date +%s) - start))s] $*"; }
failed=0
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
tar -C "$unpacked" -xJf .gpu/bundle.tar.xz || { echo "gpu-check.sh: no .gpu/bundle.tar.xz" >&2; exit 1; }
cuda_lib=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.* 2>/dev/null | head -1)")
# NCCL: the toolkit's, the system's, or (where only PyTorch brought it) pip's nvidia-nccl
nccl=$(ls /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null ||
  find / -xdev -path '*/nvidia/nccl/lib/libnccl.so.2' 2>/dev/null)
nccl=$(echo "$nccl" | head -1)
export LD_LIBRARY_PATH="$unpacked/lib:$cuda_lib:$(dirname "${nccl:-/none/x}")"
mkdir -p build/tests build/bench bin
cp "$unpacked"/bin/test_* build/tests/
cp "$unpacked/bin/bench_engine" build/bench/
cp "$unpacked/bin/nas" bin/
step "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

for t in trainer_cuda trainer_fsdp trainer_comm trainer_pipeline builtin; do
  step "test_$t"
  NAS_BIN="$repo/bin/nas" NAS_DATA_DIR="$repo/tests/data" timeout 300 "build/tests/test_$t" \
    >"$out/test_$t.txt" 2>&1 || failed=$((failed + 1))
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/test_$t.txt" | sort -u
done

step "a built-in trial with device: cuda"
trial=$(mktemp -d)
sed -e 's/optimizer: adam}/optimizer: adam, device: cuda}/' \
  -e 's/trials: 16, parallel: 2/trials: 4, parallel: 2/' examples/digits-nas.yaml >"$trial/cuda.yaml"
(cd "$trial" && NAS_DATA_DIR="$repo/tests/data" timeout 300 "$repo/bin/nas" run cuda.yaml &&
  "$repo/bin/nas" pareto digits-nas) >"$out/trial.txt" 2>&1 || failed=$((failed + 1))
tail -5 "$out/trial.txt"
rm -rf "$trial"

step "the engine against PyTorch"
timeout 600 bench/engine_gpu.sh >"$out/bench.txt" 2>&1 || failed=$((failed + 1))
tail -20 "$out/bench.txt"
step "done: $failed step(s) failed"
exit "$failed"
