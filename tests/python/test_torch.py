"""actorps.torch on an embedded job: an Embedding's gradients against a local
nn.Embedding on the same batch, and two workers' dense towers kept in step through the
shards (DenseSync) under BSP."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import actorps  # noqa: E402
from actorps.torch import DenseSync, Embedding  # noqa: E402

EMBEDDED = ["--cluster=embedded", "--servers=2", "--workers=2"]


def test_embedding_gradients_match_a_local_embedding():
    ids = torch.tensor([[1, 5, 1], [7, 5, 2]])
    weights = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 10
    out = {}

    def work(w):
        if w.id == 0:
            emb = Embedding(w, 0)
            every = np.arange(10, dtype=np.uint64)
            before = w.pull_rows(0, every).result()
            rows = emb(ids)
            (rows * weights).sum().backward()
            emb.flush()
            out["shape"] = tuple(rows.shape)
            out["before"], out["after"] = before, w.pull_rows(0, every).result()
        w.barrier()

    table = actorps.Table("emb", 4, rule="sum", init_scale=0.5, seed=3)
    assert actorps.run(work, name="py_torch_emb", tables=[table], args=EMBEDDED) == 0
    local = torch.nn.Embedding(10, 4)
    with torch.no_grad():
        local.weight.copy_(torch.from_numpy(out["before"]))
    (local(ids) * weights).sum().backward()
    assert out["shape"] == (2, 3, 4)
    # Under the sum rule the shards add the pushed gradient: after = before + grad.
    np.testing.assert_allclose(out["after"] - out["before"], local.weight.grad.numpy(), atol=1e-6)


def test_two_workers_dense_towers_agree_through_the_shards():
    finals = {}

    def work(w):
        torch.manual_seed(w.id)  # different starting weights: the first init wins
        tower = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        sync = DenseSync(w, tower, "tower")
        sync.init()
        w.barrier()
        sync.pull()
        initial = torch.cat([p.detach().reshape(-1) for p in tower.parameters()]).numpy().copy()
        rng = np.random.default_rng(w.id)
        for c in range(5):
            sync.pull()
            x = torch.from_numpy(rng.normal(size=(8, 3)).astype(np.float32))
            tower.zero_grad()
            tower(x).pow(2).mean().backward()
            sync.push()
            w.tick(c + 1).wait()
        sync.pull()
        w.leave().wait()
        w.barrier()
        sync.pull()
        finals[w.id] = torch.cat([p.detach().reshape(-1) for p in tower.parameters()]).numpy()
        finals[f"initial{w.id}"] = initial
        w.barrier()

    size = 3 * 4 + 4 + 4 + 1
    status = actorps.run(work, name="py_torch_dense", tensors=[actorps.Tensor("tower", size)], rule="sgd",
                         consistency="bsp", args=EMBEDDED + ["--lr=0.1"])
    assert status == 0
    assert np.array_equal(finals[0], finals[1])
    assert np.array_equal(finals["initial0"], finals["initial1"])  # the first init won on both
    assert np.all(np.isfinite(finals[0]))
    assert np.abs(finals[0] - finals["initial0"]).max() > 1e-4  # the pushed gradients moved the tower
