#!/bin/bash
# Point 2 of the transfer targets (docs/wire-and-caf.md, "bench_kv") in one line: 4 KiB requests between 1 server and 1 worker over TCP,
# windows 1 and 8, with window 8's rate and p50 over window 1's (the target: rate at least
# 4x, p50 at most 1.5x), and the same for bare sockets in the same run (bench_kv's
# tcp_requests limit lines) with window 8's rate over theirs. Flags after BENCH_KV go to
# it, e.g. --ps.busy-poll-us=0; with --rounds=N the rate ratio is the median of each round's.
# Usage: tools/bench_point2.sh BENCH_KV [FLAG...]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BENCH_KV [FLAG...]" >&2; exit 2; }
bench=$1
shift
"$bench" "$@" --servers=1 --workers=1 --sizes='[4096]' --windows='[1,8]' --transport=tcp --cell-seconds=2 2>/dev/null |
  /usr/bin/python3 -c '
import json, statistics, sys
rows, rounds = {}, {}
for line in sys.stdin:
    r = json.loads(line)
    if "op" in r:
        rows[(r["op"], r["window"])] = (r["gbps"] * 1e9 / 4096, r["p50_us"])
        rounds[(r["op"], r["window"])] = r.get("gbps_by_round", [])
    elif r.get("limit") == "tcp_requests":
        rows[("bare", r["window"])] = (r["per_s"], r["p50_us"])
for op in ("push", "pull", "bare"):
    (r1, p1), (r8, p8) = rows[(op, 1)], rows[(op, 8)]
    # With --rounds=N: the median of each round'"'"'s own ratio (its two windows ran side by side).
    g1, g8 = rounds.get((op, 1), []), rounds.get((op, 8), [])
    rate = statistics.median(b / a for a, b in zip(g1, g8)) if len(g1) > 1 and len(g1) == len(g8) else r8 / r1
    print(json.dumps({"op": op, "w1_per_s": round(r1), "w1_p50_us": round(p1), "w8_per_s": round(r8),
                      "w8_p50_us": round(p8), "rate_ratio": round(rate, 2), "p50_ratio": round(p8 / p1, 2),
                      "w8_of_bare": round(r8 / rows[("bare", 8)][0], 2)}))'
