"""ActorPS from Python: a job whose workers are a Python function.

A script declares its tensors (dense, by name) and sparse tables, and hands its worker
function to :func:`run`, which runs the job as its flags say, as the C++ runtime does for
an app's own binary: every role in this process (``--cluster=embedded``), a local cluster
of processes that are copies of this script (the default), or one role of a job spread
over hosts (``--role=coordinator|server|worker --coordinator=HOST:PORT``)::

    import actorps, numpy as np

    def work(w):                       # w: actorps.Worker
        w.push("w", np.ones(4, np.float32)).wait()
        w.barrier()
        return {"sums": w.pull("w").result().tolist()}

    actorps.run(work, tensors=[actorps.Tensor("w", 4)])

Requests return futures whose waits release the GIL; failures raise :class:`Error` with
the client's message (the shard, the keys, the setting). Pulls land in the memory of an
array made by :func:`buffer` when given as ``out=``, and pushes of such an array are not
copied.
"""
import os
import sys
from dataclasses import dataclass

from . import _native

__version__ = "0.2.0"
if _native.__version__ != __version__:
    raise ImportError(f"actorps {__version__} found the native library of version {_native.__version__}: "
                      "build and install them together")

Error = _native.Error
Worker = _native.Worker
Future = _native.Future


@dataclass
class Tensor:
    """A dense tensor of ``size`` floats, keys [begin, begin + size); begin None: right
    after the tensor declared before it."""
    name: str
    size: int
    begin: int = None


@dataclass
class Table:
    """A sparse table: rows of ``dim`` floats by 64-bit id, created on first touch from
    (seed, table, id), uniform in [-init_scale, init_scale), folded in with ``rule``."""
    name: str
    dim: int
    rule: str = "sum"
    lr: float = 0.01
    init_scale: float = 0.01
    seed: int = 1
    eps: float = 1e-8


def buffer(n):
    """n zeroed float32s as a numpy array a pull can land in (``pull(t, out=buf)``) and a
    push can share without a copy. While a request uses it, leave it unchanged."""
    return _native.buffer(n)


def check_trace(path):
    """The consistency trace a job wrote (--trace=FILE) checked against its bound: a dict
    with pushes, pulls, max_lag (the largest reader's clock minus minimum clock) and
    violations (empty: every read kept the SSP guarantee)."""
    return _native.check_trace(path)


def _tensor_specs(tensors):
    specs, next_begin = [], 0
    for t in tensors:
        begin = next_begin if t.begin is None else t.begin
        specs.append(_native.TensorSpec(t.name, begin, t.size))
        next_begin = begin + t.size
    return specs


def run(worker, *, tensors=(), tables=(), rule="sum", consistency="asp", name=None, args=None, script_args=()):
    """Runs a job whose workers call ``worker(w)`` (w: :class:`Worker`); returns the
    process's exit status (0: the job completed; the job's JSON lines are on stdout).

    ``script_args`` go to the copies of this script a local cluster starts, before the
    job's flags (the script's own arguments, which the job's flags do not carry).
    ``tables`` are the job's sparse tables, by index in this order. ``rule`` and
    ``consistency`` are the defaults of the job's flags (--ps.rule, --consistency,
    --staleness); ``args`` its flags (default: this script's, ``sys.argv[1:]``). The
    worker may return a dict (reported as JSON), a string or None.
    """
    script = os.path.abspath(sys.argv[0]) if sys.argv and os.path.isfile(sys.argv[0]) else ""
    name = name or os.path.splitext(os.path.basename(script))[0] or "python_app"
    args = list(sys.argv[1:] if args is None else args)
    copies = not any(a.startswith("--role=") and a != "--role=local" for a in args) and \
        "--cluster=embedded" not in args
    if copies and not script:
        raise Error("actorps.run: a local cluster of processes starts copies of the script, and this Python "
                    "runs none (an interactive session, python -c): give --cluster=embedded, or one --role")
    table_specs = [_native.TableSpec(t.name, t.dim, t.rule, t.lr, t.init_scale, t.seed, t.eps) for t in tables]
    leading = [script] + list(script_args) if script else []
    return _native.run(name, worker, _tensor_specs(tensors), table_specs, rule, consistency, args,
                       sys.executable, leading)
