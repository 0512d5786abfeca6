"""A job of its own for test_processes.py: every worker pushes id + 1 to a tensor of 4096
floats, and all pull and check the exact sums (and the rows of a table of 4 floats by id). Run as a script, it is the whole job
(--cluster=processes starts copies of it as servers and workers) or one role of it."""
import sys

import numpy as np

import actorps

N = 4096


def work(w):
    w.push("w", np.full(N, w.id + 1, np.float32)).wait()
    w.barrier()
    sums = w.pull("w", out=actorps.buffer(N)).result()
    rows = w.pull_rows(0, np.array([7, 9], np.uint64)).result()
    if rows.shape != (2, 4):
        raise RuntimeError(f"rows of table 0 have the shape {rows.shape}, not (2, 4)")
    w.barrier()
    expected = w.num_workers * (w.num_workers + 1) / 2
    if not np.all(sums == expected):
        raise RuntimeError(f"sums are not {expected}: {sums[:4]}")
    return {"worker": w.id, "sum": float(sums[0]), "right": True}


if __name__ == "__main__":
    sys.exit(actorps.run(work, tensors=[actorps.Tensor("w", N)], tables=[actorps.Table("rows", 4)]))
