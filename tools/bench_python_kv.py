#!/usr/bin/python3
"""bench_kv's grid from Python, beside the C++ client's in the same run.

Usage: tools/bench_python_kv.py [--bin=build/bin] [--sizes=4096,...] [--windows=1,8]
       [--cell-seconds=0.5] [--rounds=3]
Runs, alternating --rounds times, C++ bench_kv and the same grid from a Python worker (1
server, 1 worker, as processes, the default shared-memory transport); prints one JSON line
per cell with the median GB/s of each client over the rounds and their ratio, then a
summary line (the smallest ratio and the geometric mean).
As a job (--role=... or --job): the Python worker that measures the grid.
"""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

import actorps

BASE = 1 << 40  # bench_kv's keys start here too


def flag(name, default):
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def grid():
    """The grid from the flags, or in the job's processes from the environment (copies of
    this script started as servers and workers get the job's flags only)."""
    sizes = os.environ.get("BENCH_SIZES") or flag("sizes", "4096,65536,1048576,16777216")
    windows = os.environ.get("BENCH_WINDOWS") or flag("windows", "1,8")
    seconds = os.environ.get("BENCH_CELL_SECONDS") or flag("cell-seconds", "0.5")
    return [int(x) for x in sizes.split(",")], [int(x) for x in windows.split(",")], float(seconds)


def cell(w, tensor, op, window, seconds, payload, spare):
    """GB/s of `window` requests of `op` kept in flight for `seconds`, after two windows' warm-up."""
    inflight = []

    def issue():
        if op == "push":
            inflight.append((w.push(tensor, payload), None))
        else:
            buf = spare.pop()
            inflight.append((w.pull(tensor, out=buf), buf))

    def done():
        f, buf = inflight.pop(0)
        f.result()
        if buf is not None:
            spare.append(buf)

    for _ in range(2 * window):
        if len(inflight) == window:
            done()
        issue()
    while inflight:
        done()
    ops, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or ops < 4:
        while len(inflight) < window:
            issue()
        done()
        ops += 1
    took = time.perf_counter() - start
    while inflight:
        done()
    return ops * payload.nbytes / took / 1e9


def measure(w):
    sizes, windows, seconds = grid()
    out = []
    for size in sizes:
        name = f"t{size}"
        payload = actorps.buffer(size // 4)
        payload[:] = 1.0
        w.push(name, payload).wait()
        spare = [actorps.buffer(size // 4) for _ in range(max(windows))]
        for window in windows:
            for op in ("push", "pull"):
                out.append({"op": op, "bytes": size, "window": window,
                            "gbps": cell(w, name, op, window, seconds, payload, spare)})
    return {"cells": out}


def job(argv):
    sizes, _, _ = grid()
    tensors, begin = [], BASE
    for size in sizes:
        tensors.append(actorps.Tensor(f"t{size}", size // 4, begin))
        begin += size // 4
    return actorps.run(measure, name="bench_python_kv", tensors=tensors, args=[a for a in argv if a != "--job"])


def cpp_cells(binary):
    sizes, windows, seconds = grid()
    done = subprocess.run([binary, "--servers=1", "--workers=1", f"--sizes=[{','.join(map(str, sizes))}]",
                           f"--windows=[{','.join(map(str, windows))}]", f"--cell-seconds={seconds}"],
                          capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"op"')]
    return {(c["op"], c["bytes"], c["window"]): c["gbps"] for c in lines if c.get("transport") == "shm"}


def python_cells():
    me = os.path.abspath(__file__)
    sizes, windows, seconds = grid()
    env = dict(os.environ, BENCH_SIZES=",".join(map(str, sizes)), BENCH_WINDOWS=",".join(map(str, windows)),
               BENCH_CELL_SECONDS=str(seconds))
    done = subprocess.run([sys.executable, me, "--job", "--servers=1", "--workers=1"], env=env,
                          capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines():
        if line.startswith('{"cells"'):
            return {(c["op"], c["bytes"], c["window"]): c["gbps"] for c in json.loads(line)["cells"]}
    raise SystemExit("the Python job reported no cells:\n" + done.stderr[-2000:])


def median(values):
    s = sorted(values)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def main():
    binary = os.path.join(flag("bin", "build/bin"), "bench_kv")
    rounds = int(flag("rounds", "3"))
    cpp_runs, python_runs = [], []
    for _ in range(rounds):  # alternating, so both see the machine's same moods
        cpp_runs.append(cpp_cells(binary))
        python_runs.append(python_cells())
    ratios = []
    for key in sorted(python_runs[0]):
        cpp, python = median([r[key] for r in cpp_runs]), median([r[key] for r in python_runs])
        ratios.append(python / cpp)
        op, size, window = key
        print(json.dumps({"op": op, "bytes": size, "window": window, "python_gbps": python, "cpp_gbps": cpp,
                          "python_gbps_runs": [r[key] for r in python_runs], "cpp_gbps_runs": [r[key] for r in cpp_runs],
                          "ratio": ratios[-1]}))
    print(json.dumps({"summary": "python/cpp", "cells": len(ratios), "min_ratio": min(ratios),
                      "geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios))}))


if __name__ == "__main__":
    if "--job" in sys.argv or any(a.startswith("--role=") for a in sys.argv):
        sys.exit(job(sys.argv[1:]))
    main()
