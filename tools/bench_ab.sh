#!/bin/bash
# Two bench_kv commands in alternating rounds, as BENCHMARKS.md's A/B tables were run: the
# VM's speed drifts by 2x within an hour, so A and B take turns rather than runs in a row.
# Usage: tools/bench_ab.sh OUTDIR ROUNDS "A command" "B command"
#   e.g. git worktree add /tmp/old c0f6b0f (built there), then
#   tools/bench_ab.sh /tmp/ab 3 "build/bin/bench_kv --servers=1 --workers=1 --transport=shm" \
#                               "/tmp/old/build/bin/bench_kv --servers=1 --workers=1 --transport=shm"
# or one binary with two flag sets. Prints, per cell, GB/s of A and B in each round, their
# medians, B's median over A's and in how many rounds B moved more, and each round's limit
# lines; the JSON lines stay in OUTDIR/{a,b}.ROUND.json.
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 OUTDIR ROUNDS \"A command\" \"B command\"" >&2; exit 2; }
out=$1 rounds=$2 a=$3 b=$4
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  echo "bench_ab: round $r of $rounds" >&2
  $a 2>/dev/null > "$out/a.$r.json"
  $b 2>/dev/null > "$out/b.$r.json"
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, sys, collections, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
cells = collections.defaultdict(dict)
for side in "ab":
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}.json"):
            d = json.loads(line)
            if "limit" in d:
                value = f"{d['gbps']:.2f} GB/s" if "gbps" in d else f"{d['per_s']:.0f}/s at window {d['window']}"
                print(f"round {r} {side}: {d['limit']} {value}")
                continue
            key = (d["op"], d["transport"], d["servers"], d["bytes"], d["window"])
            cells[key][(side, r)] = d["gbps"]
for key in sorted(cells):
    v = cells[key]
    a = [v.get(("a", r), 0) for r in range(1, rounds + 1)]
    b = [v.get(("b", r), 0) for r in range(1, rounds + 1)]
    ma, mb = statistics.median(a), statistics.median(b)
    won = sum(y > x for x, y in zip(a, b))
    print(f"{key[0]} {key[1]} {key[2]}x{key[2]} {key[3]} B window {key[4]}: "
          f"A {' / '.join(f'{x:.2f}' for x in a)} | B {' / '.join(f'{x:.2f}' for x in b)} | "
          f"medians {ma:.2f} {mb:.2f}, B/A {mb / ma if ma else 0:.2f}, B higher in {won} of {rounds}")
PY
