#!/usr/bin/python3
"""The transfer targets (docs/wire-and-caf.md, "bench_kv"), read from bench_kv's JSON lines (one or more files; a file may hold
both shapes, as bench_kv writes them without --servers/--workers).

Usage: tools/kv_targets.py FILE...   e.g. the ap_*_1x1.txt of tools/pslite/compare.sh
Prints per file: window 8 over window 1 in every cell (target >= 0.9), TCP cells of 1 MiB
and more over the TCP limit of the same run (>= 0.9), and 1x1 ring cells over the TCP
limit (>= 2 at window 8 from 1 MiB, at window 1 from 16 MiB). A cell short of its target
is marked '<'. For 1x1 4 KiB cells, point 2 too: window 8's requests/s over window 1's
(>= 4) and its p50 over window 1's (at most 1.5: '>' marks one above). Given several
files (rounds of the same run), it then prints each shape's cells' medians over them:
on this VM one run's cell moves by 15% or more.
"""
import json
import statistics
import sys


def load(path):
    """The run's TCP limit and its cells by shape ("1x1": {(transport, op, bytes, window): row})."""
    limit, shapes = None, {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d.get("limit") == "tcp_loopback":
            limit = d["gbps"]
        elif "op" in d:
            cells = shapes.setdefault(f"{d['servers']}x{d['workers']}", {})
            cells[(d["transport"], d["op"], d["bytes"], d["window"])] = d
    return limit, shapes


def mark(value, target):
    """target: a floor, or ("at most", ceiling)."""
    if isinstance(target, tuple):
        return f"{value:.2f}{'>' if value > target[1] else ''}"
    return f"{value:.2f}{'<' if value < target else ''}"


def window_ratio(w8, w1, target):
    """("w8/w1", value, target): of the medians, or the median of per-round ratios when both
    rows carry the same rounds."""
    r8, r1 = w8.get("gbps_by_round", []), w1.get("gbps_by_round", [])
    if len(r8) > 1 and len(r8) == len(r1):
        return (f"w8/w1 (paired, {len(r8)})", statistics.median(a / b for a, b in zip(r8, r1)), target)
    return ("w8/w1", w8["gbps"] / w1["gbps"], target)


def over_tcp_limit(row, limit):
    """The row's gbps over the TCP limit: the median of each round's over the limit measured
    just before it (bench_kv's rows carry them), else over the run's first limit."""
    rounds, limits = row.get("gbps_by_round", []), row.get("tcp_limit_by_round", [])
    if rounds and len(rounds) == len(limits) and all(limits):
        return statistics.median(g / l for g, l in zip(rounds, limits))
    return row["gbps"] / limit


def ratios(limit, cells):
    """{(transport, op, KiB): [(label, value, target), ...]} for one run."""
    out = {}
    for (transport, op, size, window), d in sorted(cells.items()):
        if window != 8 or (transport, op, size, 1) not in cells:
            continue
        shape = f"{d['servers']}x{d['workers']}"
        w1 = cells[(transport, op, size, 1)]["gbps"]
        point2 = shape == "1x1" and size == 4096  # the rate ratio is gbps's: same size
        parts = [window_ratio(d, cells[(transport, op, size, 1)], 4.0 if point2 else 0.9)]
        if point2:
            parts.append(("p50 w8/w1", d["p50_us"] / cells[(transport, op, size, 1)]["p50_us"], ("at most", 1.5)))
        for w, row in ((1, cells[(transport, op, size, 1)]), (8, d)):
            if transport == "tcp" and size >= 1 << 20:
                parts.append((f"w{w}/limit", over_tcp_limit(row, limit), 0.9))
            if transport == "shm" and shape == "1x1" and (size >= 16 << 20 or (w == 8 and size >= 1 << 20)):
                parts.append((f"w{w}/limit", over_tcp_limit(row, limit), 2.0))
        out[(transport, op, size >> 10)] = parts
    return out


def copy_over_limit(cells):
    """memcpy over the TCP limit in each round of the rows that carry both (deduplicated: a
    round's limits are shared by its cells), or None. A ring copies the bytes once on each
    side, two passes on two vCPUs, so it moves at most one thread's memcpy: 2x the TCP limit
    needs this at 2 or more."""
    seen = {(tuple(d["tcp_limit_by_round"]), tuple(d["memcpy_by_round"]))
            for d in cells.values() if d.get("tcp_limit_by_round") and d.get("memcpy_by_round")}
    ratios = sorted(m / t for tl, ml in seen for t, m in zip(tl, ml) if t > 0)
    return ratios or None


def show(cells):
    for (transport, op, kib), parts in sorted(cells.items()):
        print(f"  {transport} {op} {kib} KiB: " + ", ".join(f"{label} {mark(v, t)}" for label, v, t in parts))


by_shape = {}
for path in sys.argv[1:]:
    limit, shapes = load(path)
    for shape, cells in sorted(shapes.items()):
        print(f"{path}: {shape}, TCP limit {limit:.2f} GB/s")
        run = ratios(limit, cells)
        show(run)
        copy = copy_over_limit(cells)
        if copy:
            print(f"  memcpy over the TCP limit, {len(copy)} rounds: median {statistics.median(copy):.2f} "
                  f"({copy[0]:.2f}-{copy[-1]:.2f}); a ring's ceiling, against the 2x target")
        by_shape.setdefault(shape, []).append(run)

for shape, runs in by_shape.items():
    if len(runs) < 2:
        continue
    print(f"{shape}: medians of {len(runs)} runs")
    common = set.intersection(*(set(r) for r in runs))
    show({cell: [(label, statistics.median(r[cell][i][1] for r in runs), target)
                 for i, (label, _, target) in enumerate(runs[0][cell])] for cell in common})
