#!/bin/bash
# Context switches and wake-ups per request while bench_kv runs one cell, 1 server x 1
# worker: where timing is too noisy on this VM to see a change, the handoffs between
# threads that a request costs can still be counted (BENCHMARKS.md, "Readers run the
# actors they wake"). Needs perf (Debian's linux-perf) and root.
# Usage: tools/bench_handoffs.sh BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]
#   e.g. tools/bench_handoffs.sh build/bin/bench_kv 4096 8 push tcp --ps.busy-poll-us=0
# perf counts the whole machine for 2 s inside the cell (5 s per cell; a pull cell
# follows its push cell), so run nothing else meanwhile.
set -euo pipefail
. "$(dirname "$0")/bench_cell_start.sh"
start_op_cell 1.5 7 "$@"
perf stat -e context-switches,sched:sched_wakeup,task-clock,raw_syscalls:sys_enter,syscalls:sys_enter_futex -a -x, -o "$out/perf" -- sleep 2
wait $cell_pid
/usr/bin/python3 - "$out" "$op" "$size" "$window" "$transport" <<'PY'
import json, sys
out, op, size, window, transport = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = [json.loads(l) for l in open(f"{out}/rows.json") if '"op"' in l]
row = [r for r in rows if r["op"] == op][0]
rate = row["gbps"] * 1e9 / size
counts = {}
for line in open(f"{out}/perf"):
    f = line.strip().split(",")
    if len(f) > 3 and f[0].replace(".", "").isdigit():
        counts[f[2]] = float(f[0])
per_op = lambda event: counts[event] / (2 * rate)
print(json.dumps({"op": op, "bytes": size, "window": int(window), "transport": transport,
                  "requests_per_s": round(rate), "p50_us": round(row["p50_us"]),
                  "context_switches_per_request": round(per_op("context-switches"), 2),
                  "wakeups_per_request": round(per_op("sched:sched_wakeup"), 2),
                  "syscalls_per_request": round(per_op("raw_syscalls:sys_enter"), 2),
                  "futex_calls_per_request": round(per_op("syscalls:sys_enter_futex"), 2),
                  "cpu_ms_per_request": round(per_op("task-clock"), 4)}))
PY
rm -rf "$out"
