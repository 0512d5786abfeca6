#!/usr/bin/env bash
# The fuzz test: builds the libFuzzer targets with clang (ASan and UBSan on) in BUILD and
# runs each on its committed corpus for SECONDS. Fails on any crash, leak or undefined
# behaviour; the input that did it is left in BUILD/crashes.
#   tests/fuzz/run.sh SOURCE_DIR BUILD_DIR [SECONDS]
set -euo pipefail
src=$1 build=$2 seconds=${3:-10}
if ! command -v clang++ >/dev/null; then
  echo "clang++ is missing (apt-get install clang libomp-dev)" >&2
  exit 1
fi
targets=(codec checkpoint criteo frames config wire)
cmake -S "$src" -B "$build" -DPS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPS_WITH_CUDA=OFF >"$build.log" 2>&1 || { tail -20 "$build.log"; exit 1; }
make -C "$build" -j2 "${targets[@]/#/fuzz_}" >>"$build.log" 2>&1 || { tail -40 "$build.log"; exit 1; }
mkdir -p "$build/crashes"
for t in "${targets[@]}"; do
  found="$build/new-corpus/$t"  # what this run finds; the committed corpus stays as it is
  mkdir -p "$found"
  echo "fuzz_$t: ${seconds} s on tests/fuzz/corpus/$t ($(ls "$src/tests/fuzz/corpus/$t" | wc -l) inputs)"
  "$build/bin/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$build/crashes/$t-" -print_final_stats=1 "$found" "$src/tests/fuzz/corpus/$t" \
    2>"$build/fuzz_$t.log" || { tail -40 "$build/fuzz_$t.log"; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/fuzz_$t.log" | tr '\n' ' '
  echo
done
