#!/usr/bin/python3
"""One 16 MiB tensor pulled in a loop by a Python worker (1 server, 1 worker, processes):
ms per pull landing in one actorps.buffer (out=) and with a fresh array each time,
alternating, 1 s each, twice (BENCHMARKS.md, "Python against C++").
Usage: tools/bench_python_pull_loop.py (its last worker line is the result)."""
import sys
import time

import actorps

N = 4 * 1024 * 1024


def work(w):
    buf = actorps.buffer(N)
    buf[:] = 1
    w.push("t", buf).wait()
    out = {}
    for i, mode in enumerate(("out", "fresh", "out", "fresh")):
        into, start, n = actorps.buffer(N), time.perf_counter(), 0
        while time.perf_counter() - start < 1.0:
            (w.pull("t", out=into) if mode == "out" else w.pull("t")).result()
            n += 1
        out[f"{mode}{i}_ms"] = (time.perf_counter() - start) / n * 1000
    return out


if __name__ == "__main__":
    sys.exit(actorps.run(work, tensors=[actorps.Tensor("t", N, 1 << 40)], args=sys.argv[1:] or
                         ["--servers=1", "--workers=1"]))
