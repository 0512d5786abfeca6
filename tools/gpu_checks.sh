#!/bin/bash
# The CUDA path on a machine with a CUDA device, run from a build directory:
#   ../tools/gpu_checks.sh [OUT_DIR]
# The CUDA kernels and tower against the host's (test_kernels_cuda, test_ctr_backends: the
# ctest tests that skip without a GPU), bench_aggregate on both backends, and train_ctr's
# tower on the host and on the GPU over the same gen_ctr data. Each step's whole output goes
# to OUT_DIR/<step>.log; this prints each step's exit status, time and last lines.
set -u
out=${1:-gpu-checks}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "cores: $(nproc)"

step() {
  local name=$1
  shift
  echo "== $name: $*"
  local start=$(date +%s%N)
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $(( ($(date +%s%N) - start) / 1000000 )) ms"
  tail -n "${TAIL_LINES:-6}" "$out/$name.log"
}

step kernels_cuda bin/test_kernels_cuda
step ctr_backends bin/test_ctr_backends
step aggregate_cuda bin/bench_aggregate --backend=cuda --codecs=
step aggregate_host bin/bench_aggregate --backend=host --codecs=
bin/gen_ctr --out=ctr-gpu --train-rows=200000 --test-rows=20000 >/dev/null || exit 1
for backend in host cuda host,cuda; do
  step "train_${backend/,/_}" bin/train_ctr --train=ctr-gpu/train.tsv --test=ctr-gpu/test.tsv --backend=$backend
done
