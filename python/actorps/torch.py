"""PyTorch modules whose parameters live on the shards.

:class:`Embedding` is a sparse table as an ``nn.Module``: forward pulls the rows of the
batch's ids, backward pushes their gradients, and the table's server-side rule (Adagrad,
SGD, or a rule of the job's own) updates them there. :class:`DenseSync` keeps a dense
module's parameters in one tensor of the job: it pulls them before forward and pushes
their gradients after backward, so every worker's copy follows the shards' under the job's
consistency (BSP, SSP or ASP), the parameter server's way rather than an allreduce's: the
same shards, clocks and failover serve the dense part and the embeddings.
"""
import numpy as np
import torch
from torch import nn


class Embedding(nn.Module):
    """Rows of sparse table ``table`` (its index in the job's tables) by id.

    ``forward(ids)`` takes an integer tensor of any shape and returns float32 rows of
    shape ``ids.shape + (dim,)``; each distinct id is pulled once. The gradients of a
    backward are pushed as it finishes (repeated ids summed); :meth:`flush` waits for them.
    """

    def __init__(self, worker, table):
        super().__init__()
        self.worker, self.table = worker, table
        self.dim = worker.table_dim(table)
        self._pushes = []
        self._prepared = None  # (the ids tensor, its distinct ids, their inverse, the pull in flight)

    def _pull(self, ids):
        flat = ids.reshape(-1).cpu().numpy()  # integers; negative ones are refused by pull_rows
        unique, inverse = np.unique(flat, return_inverse=True)
        return ids, unique, inverse, self.worker.pull_rows(self.table, unique)

    def prepare(self, ids):
        """Sends the pull of these ids' rows now, so that several tables' pulls are in
        flight together; the next forward of this same tensor uses it."""
        self._prepared = self._pull(ids)

    def forward(self, ids):
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared[0] is not ids:
            prepared = self._pull(ids)
        _, unique, inverse, pulled = prepared
        rows = torch.from_numpy(pulled.result())
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            rows.register_hook(lambda grad: self._push(unique, grad))
        return rows[torch.from_numpy(inverse)].reshape(*ids.shape, self.dim)

    def _push(self, unique, grad):
        values = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
        self._pushes.append(self.worker.push_rows(self.table, unique, values))

    def flush(self):
        """Waits for the pushed gradients; raises actorps.Error if one failed."""
        pushes, self._pushes = self._pushes, []
        for p in pushes:
            p.result()


class DenseSync:
    """A dense module's parameters as the job's tensor ``tensor`` (its size is the sum of
    the parameters' sizes, in ``module.parameters()`` order).

    :meth:`pull` copies the shards' values into the module (call it before forward);
    :meth:`push` sends the module's gradients (after backward), which the job's rule
    applies on the shards. :meth:`init` sets the shards' values from this module's (the
    first initializer wins: call it on every worker, then barrier).
    """

    def __init__(self, worker, module, tensor):
        import actorps
        self.worker, self.module, self.tensor = worker, module, tensor
        self.params = [p for p in module.parameters()]
        self.size = sum(p.numel() for p in self.params)
        self._values = actorps.buffer(self.size)
        self._grads = actorps.buffer(self.size)
        self._pending = None

    def _flat(self, tensors, into):
        offset = 0
        for t in tensors:
            n = t.numel()
            into[offset:offset + n] = t.detach().reshape(-1).cpu().numpy()
            offset += n
        return into

    def init(self):
        self.worker.init(self.tensor, self._flat(self.params, self._values)).result()

    def pull(self):
        if self._pending is not None:  # the last push has landed before the next pull
            self._pending.result()
            self._pending = None
        values = torch.from_numpy(self.worker.pull(self.tensor, out=self._values).result())
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(values[offset:offset + n].reshape(p.shape))
                offset += n

    def push(self):
        if self._pending is not None:  # the buffer is reused: the last push has read it
            self._pending.result()
            self._pending = None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._pending = self.worker.push(self.tensor, self._flat(grads, self._grads))
