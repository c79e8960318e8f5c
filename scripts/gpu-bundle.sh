#!/usr/bin/env bash
# Packs what the GPU checks need for a machine that has a GPU and CUDA but none of nas's
# Debian libraries and no network (issue 21): the CUDA build's bin/nas, the five test
# binaries with GPU tests and bench_engine, with every shared library they load except glibc's, libstdc++'s
# and CUDA's own (the machine's cuBLAS and NCCL are used), into .gpu/bundle.tar.xz, which git
# ignores. The machine needs a glibc at least as new as the build's. Then, there, from a copy
# of this checkout holding .gpu/: scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
bins=("$BIN/nas" "$BUILD/bench/bench_engine")
for t in trainer_cuda trainer_fsdp trainer_comm trainer_pipeline builtin; do
  bins+=("$BUILD/tests/test_$t")
done
make -j"$(nproc)" "${bins[@]}" >/dev/null
nm "$BIN/nas" | grep ' cudaGetDeviceCount$' >/dev/null || # (not -q: nm would get SIGPIPE)
  { echo "gpu-bundle.sh: $BIN/nas is not a CUDA build (is nvcc on the PATH?)" >&2; exit 1; }
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .gpu
cp "${bins[@]}" "$stage/bin/"
ldd "${bins[@]}" | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|libgcc_s|libstdc\+\+)\.so|ld-linux' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -C "$stage" -cf - bin lib | xz -T0 -6 >.gpu/bundle.tar.xz
echo "gpu-bundle.sh: .gpu/bundle.tar.xz, $(du -h .gpu/bundle.tar.xz | cut -f1)," \
  "$(ls "$stage/lib" | wc -l) libraries"
