#!/bin/bash
# Which kernel timers fire, and how often, while bench_kv runs one cell: BBR's pacing
# (tcp_pace_kick) showed up here (BENCHMARKS.md, "Pull answers leave under cubic"). Needs
# perf (Debian's linux-perf) and root; counts the whole machine for 1 s inside the cell,
# so run nothing else meanwhile. servers=N workers=N in the environment pick the shape
# (1 x 1 by default).
# Usage: [servers=2 workers=2] tools/bench_timers.sh BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]
#   e.g. servers=2 workers=2 tools/bench_timers.sh build/bin/bench_kv 1048576 8 pull tcp --ps.tcp-congestion=system
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]" >&2; exit 2; }
bench=$1 size=$2 window=$3 op=$4 transport=${5:-tcp}
shift $(( $# < 5 ? $# : 5 ))  # what is left: flags for bench_kv
case $op in push) into=1.5 ;; pull) into=6.5 ;; *) echo "$0: op must be push or pull, not '$op'" >&2; exit 2 ;; esac
out=$(mktemp -d)
. "$(dirname "$0")/bench_cell_start.sh"
start_cell "$out" --sizes="[$size]" --windows="[$window]" --transport="$transport" --cell-seconds=5 "$@"
sleep "$into"
perf record -e timer:hrtimer_expire_entry,timer:timer_expire_entry -a -o "$out/perf.data" -- sleep 1 2>/dev/null >/dev/null
wait $cell_pid
row=$(grep "\"op\":\"$op\"" "$out/rows.json" | head -1)
echo "$row"
echo "timers fired in 1 s, by function:"
perf script -i "$out/perf.data" 2>/dev/null | grep -o "function=[A-Za-z_0-9.]*" | sort | uniq -c | sort -rn | head -8
