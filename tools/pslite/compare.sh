#!/bin/bash
# ps-lite beside bench_kv (the transfer targets, docs/wire-and-caf.md), for BENCHMARKS.md's table. Not part of the build:
# ps-lite is not a Debian package. Needs libzmq3-dev, libprotobuf-dev, protobuf-compiler
# and ps-lite's source (dmlc/ps-lite) in /tmp/ps-lite; builds it there, then runs two
# rounds of: ps-lite 1x1, bench_kv 1x1, ps-lite 2x2, bench_kv 2x2, and prints the table
# (GB/s, "round 1 / round 2"; ratios are ActorPS over ps-lite; workers' rates summed).
# Run from the repository root after ./run build: tools/pslite/compare.sh [OUTDIR]; run it
# again to other OUTDIRs and tools/pslite/table.py DIR1 DIR2 ... gives medians over all rounds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-/tmp/pslite-compare}
mkdir -p "$out" /tmp/ps-lite/build
(cd /tmp/ps-lite/build && cmake .. -DCMAKE_BUILD_TYPE=Release > cmake.log && make -j2 pslite > make.log)
g++ -O2 -std=c++14 "$here/bench.cc" -I/tmp/ps-lite/include -I/tmp/ps-lite/build /tmp/ps-lite/build/libpslite.a \
  -lzmq -lprotobuf -lpthread -o "$out/bench"
sizes='[4096,65536,1048576,16777216,67108864]'
for round in 1 2; do
  for shape in 1 2; do
    (cd "$out" && timeout 120 "$here/run.sh" $shape $shape $((8200 + round * 10 + shape)) > "pl_${round}_${shape}x${shape}.txt" 2>/dev/null)
    timeout 300 "$repo/build/bin/bench_kv" --servers=$shape --workers=$shape --sizes=$sizes \
      > "$out/ap_${round}_${shape}x${shape}.txt" 2>/dev/null
  done
done
/usr/bin/python3 "$here/table.py" "$out"
