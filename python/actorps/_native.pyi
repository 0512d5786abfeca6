"""Type stubs of actorps._native, the C++ client and runtime (python/native/)."""
from typing import Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

__version__: str
protocol_version: int


class Error(RuntimeError):
    """A request, a setting or a job failed; the message is the C++ client's."""


class TensorSpec:
    def __init__(self, name: str, begin: int, size: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def begin(self) -> int: ...
    @property
    def size(self) -> int: ...


class TableSpec:
    def __init__(self, name: str, dim: int, rule: str = "sum", lr: float = 0.01, init_scale: float = 0.01,
                 seed: int = 1, eps: float = 1e-8) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def dim(self) -> int: ...


class Future:
    """A request in flight; waits release the GIL."""
    def done(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits (at most timeout seconds); False when still pending."""
    def result(self) -> Optional[npt.NDArray[np.float32]]:
        """The pulled values (the out= array itself for a pull into a buffer), None for a
        push, init or tick; raises Error when the request failed. Once per future."""


class Worker:
    """A worker's handle on its job, valid while the worker function runs."""
    @property
    def id(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def start_clock(self) -> int: ...
    def push(self, tensor: str, values: npt.NDArray[np.float32]) -> Future:
        """Folds values (the whole tensor, float32) into the tensor with the job's rule."""
    def init(self, tensor: str, values: npt.NDArray[np.float32]) -> Future:
        """Sets the tensor's values where none were set (the first initializer wins)."""
    def pull(self, tensor: str, out: Optional[npt.NDArray[np.float32]] = None) -> Future:
        """The tensor's values; with out= (an actorps.buffer of the tensor's size) they land in it."""
    def push_rows(self, table: int, ids: npt.NDArray[np.uint64], grads: npt.NDArray[np.float32]) -> Future:
        """Folds grads (len(ids) x dim) into rows ids of table `table` with the table's rule."""
    def pull_rows(self, table: int, ids: npt.NDArray[np.uint64]) -> Future:
        """Rows ids of table `table`, (len(ids), dim), created on first touch."""
    def tick(self, clock: int) -> Future:
        """This worker has completed `clock` iterations (SSP/BSP reads wait on the slowest)."""
    def leave(self) -> Future:
        """This worker has finished its iterations: reads stop waiting for it."""
    def barrier(self) -> None:
        """Waits until every running worker has reached this barrier."""
    def report(self, text: str) -> None:
        """A progress line for the job's observer."""
    def table_dim(self, table: int) -> int: ...


def run(name: str, worker: Callable[[Worker], object], tensors: Sequence[TensorSpec], tables: Sequence[TableSpec],
        rule: str, consistency: str, args: Sequence[str], program: str, leading: Sequence[str]) -> int: ...
def buffer(n: int) -> npt.NDArray[np.float32]: ...
def check_trace(path: str) -> dict: ...
