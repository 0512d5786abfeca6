#!/bin/bash
# Packs what tools/gpu_checks.sh runs into DIR (default .gpu) for a machine that has a CUDA
# device but not this machine's Debian libraries: DIR/bin holds the programs (stripped),
# DIR/lib every shared library they load except glibc's own and the CUDA driver's.
# Run from the repository root after a build that found nvcc; then, on the GPU machine:
#   cd DIR && LD_LIBRARY_PATH=$PWD/lib ../tools/gpu_checks.sh OUT_DIR
set -euo pipefail
dir=${1:-.gpu}
programs=(test_kernels_cuda test_ctr_backends bench_aggregate gen_ctr train_ctr psnode)
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
for p in "${programs[@]}"; do
  [ -x "build/bin/$p" ] || { echo "gpu_bundle: build/bin/$p is missing (a build with nvcc makes it)" >&2; exit 1; }
  strip --strip-all -o "$dir/bin/$p" "build/bin/$p"
done
ldd "${programs[@]/#/build/bin/}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
du -sh "$dir/bin" "$dir/lib"
