"""A job of its own for test_processes.py: every worker pushes id + 1 to a tensor of 4096
floats, and all pull and check the exact sums. Run as a script, it is the whole job
(--cluster=processes starts copies of it as servers and workers) or one role of it."""
import sys

import numpy as np

import actorps

N = 4096


def work(w):
    w.push("w", np.full(N, w.id + 1, np.float32)).wait()
    w.barrier()
    sums = w.pull("w", out=actorps.buffer(N)).result()
    w.barrier()
    expected = w.num_workers * (w.num_workers + 1) / 2
    if not np.all(sums == expected):
        raise RuntimeError(f"sums are not {expected}: {sums[:4]}")
    return {"worker": w.id, "sum": float(sums[0]), "right": True}


if __name__ == "__main__":
    sys.exit(actorps.run(work, tensors=[actorps.Tensor("w", N)]))
