#!/bin/bash
# Which kernel timers fire, and how often, while bench_kv runs one cell: BBR's pacing
# (tcp_pace_kick) showed up here (BENCHMARKS.md, "Data connections under cubic"). Needs
# perf (Debian's linux-perf) and root; counts the whole machine for 1 s inside the cell,
# so run nothing else meanwhile. servers=N workers=N in the environment pick the shape
# (1 x 1 by default).
# Usage: [servers=2 workers=2] tools/bench_timers.sh BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]
#   e.g. servers=2 workers=2 tools/bench_timers.sh build/bin/bench_kv 1048576 8 pull tcp --ps.tcp-congestion=system
set -euo pipefail
. "$(dirname "$0")/bench_cell_start.sh"
start_op_cell 1.5 6.5 "$@"
perf record -e timer:hrtimer_expire_entry,timer:timer_expire_entry -a -o "$out/perf.data" -- sleep 1 2>/dev/null >/dev/null
wait $cell_pid
row=$(grep "\"op\":\"$op\"" "$out/rows.json" | head -1)
echo "$row"
echo "timers fired in 1 s, by function:"
perf script -i "$out/perf.data" 2>/dev/null | grep -o "function=[A-Za-z_0-9.]*" | sort | uniq -c | sort -rn | head -8
