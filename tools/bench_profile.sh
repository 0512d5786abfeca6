#!/bin/bash
# Where the CPU goes while bench_kv runs one cell: perf samples the whole machine for 2 s
# inside the cell and this prints the cell's row, then the largest shares by process role
# (server, worker, idle, other) and by thread and symbol (BENCHMARKS.md, "What a push costs
# on two vCPUs"). A share is of both vCPUs' time, idle included. Needs perf (Debian's
# linux-perf) and root; run nothing else meanwhile. servers=N workers=N pick the shape.
# Usage: [servers=2 workers=2] tools/bench_profile.sh BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]
#   e.g. tools/bench_profile.sh build/bin/bench_kv 16777216 1 push tcp
set -euo pipefail
. "$(dirname "$0")/bench_cell_start.sh"
start_op_cell 1.5 7 "$@"
ps -eLo pid,tid,args --no-headers > "$out/threads"  # which tid belongs to which role
perf record -F 2999 -a -o "$out/perf.data" -- sleep 2 2>/dev/null >/dev/null
wait $cell_pid
grep "\"op\":\"$op\"" "$out/rows.json" | head -1
perf report -i "$out/perf.data" --no-children --sort pid,sym -g none --stdio 2>/dev/null | grep "%" > "$out/report"
/usr/bin/python3 - "$out" <<'PY'
import collections, re, sys
out = sys.argv[1]
role = {}
for line in open(f"{out}/threads"):
    pid, tid, args = line.split(None, 2)
    m = re.search(r"--role=(\w+)", args)
    role[tid] = m.group(1) if m and "psnode" in args else ("idle" if tid == "0" else "other")
by_role, rows = collections.Counter(), []
for line in open(f"{out}/report"):
    m = re.match(r"\s*([\d.]+)%\s+(\d+):(\S+)\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    share, tid, comm, where, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4), m.group(5).strip()
    r = role.get(tid, "idle" if tid == "0" else "other")
    by_role[r] += share
    rows.append((share, f"{r} {tid}:{comm}", ("kernel " if where == "k" else "") + sym[:90]))
print("by role: " + ", ".join(f"{r} {s:.1f}%" for r, s in by_role.most_common()))
for share, thread, sym in rows[:14]:
    print(f"{share:6.2f}%  {thread:28s} {sym}")
PY
