#!/bin/bash
# One bench_kv cell, 1 server x 1 worker, with its two processes pinned to vCPUs once they
# registered: whether a cell is bound by a process's own work or by the hops between the
# vCPUs (BENCHMARKS.md, "A reader sums what nothing follows": at 4 KiB window 8 both
# processes on one vCPU moved as many requests as on two). Prints requests/s and p50 per op.
# Usage: tools/bench_pinned.sh BENCH_KV none|apart|together [SIZE [WINDOW]]
#   none: as the scheduler places them; apart: server on vCPU 0, worker on 1; together: both on 0.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BENCH_KV none|apart|together [SIZE [WINDOW]]" >&2; exit 2; }
bench=$1 mode=$2 size=${3:-4096} window=${4:-8}
case $mode in none|apart|together) ;; *) echo "$0: mode must be none, apart or together, not '$mode'" >&2; exit 2 ;; esac
out=$(mktemp -d)
. "$(dirname "$0")/bench_cell_start.sh"
start_cell "$out" --sizes="[$size]" --windows="[$window]" --transport=tcp --cell-seconds=4
if [ "$mode" != none ]; then
  for p in $(pgrep -P $cell_pid psnode); do
    cpu=0
    [ "$mode" = apart ] && ! tr '\0' ' ' < /proc/$p/cmdline | grep -q -- '--role=server' && cpu=1
    taskset -a -p -c $cpu $p > /dev/null
  done
fi
wait $cell_pid
/usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "op" in r:
        print(json.dumps({"mode": sys.argv[2], "op": r["op"], "bytes": r["bytes"], "window": r["window"],
                          "requests_per_s": round(r["gbps"] * 1e9 / r["bytes"]), "p50_us": round(r["p50_us"])}))' "$out/rows.json" "$mode"
rm -rf "$out"
