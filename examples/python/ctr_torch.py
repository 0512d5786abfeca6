#!/usr/bin/python3
"""Click prediction in PyTorch with the embeddings on the shards (a DLRM-style model).

    python3 examples/python/ctr_torch.py --train=FILE --test=FILE [--servers=2 --workers=2 --epochs=1]
    python3 examples/python/ctr_torch.py --train=FILE --test=FILE --local   # plain PyTorch, no shards

Criteo's TSV (label, 13 integers, 26 hex ids; gen_ctr writes such files). One sparse table
per categorical field (16 floats per row, Adagrad lr 0.05 eps 0.01, rows created on first
touch) and the integers as log(1 + x), into an MLP tower (256, 128, ReLU, one logit) kept in
one dense tensor of the job (Adam, lr 0.001), logistic loss: train_ctr's model. Each batch
(256 rows) is one clock; row i of the training file is worker i % workers's. After each
epoch worker 0 scores the test file. The last stdout line is a JSON object with test_auc,
samples_per_s and status. Other flags go to the job (actorps.run).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

import actorps
from actorps.torch import DenseSync, Embedding

FIELDS, INTS, DIM = 26, 13, 16


def read_criteo(path, part=0, parts=1):
    """(labels, log(1 + integers), ids per field) of rows part, part + parts, ..., and the
    file's row count."""
    labels, ints, ids, rows = [], [], [], 0
    with open(path) as f:
        for i, line in enumerate(f):
            rows += 1
            if i % parts != part:
                continue
            v = line.rstrip("\n").split("\t")
            if len(v) != 1 + INTS + FIELDS:
                raise SystemExit(f"{path}:{i + 1}: {len(v)} tab-separated fields, expected 40")
            labels.append(float(v[0]))
            ints.append([max(int(x), 0) if x else 0 for x in v[1:1 + INTS]])
            ids.append([int(x, 16) if x else 0 for x in v[1 + INTS:]])
    return (np.array(labels, np.float32), np.log1p(np.array(ints, np.float32)),
            np.array(ids, np.uint64).reshape(-1, FIELDS)), rows


def tower():
    """train_ctr's tower and initialisation: He-uniform weights (bound sqrt(6 / fan_in)), zero biases."""
    net = nn.Sequential(nn.Linear(INTS + FIELDS * DIM, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                        nn.Linear(128, 1))
    for layer in net[::2]:
        nn.init.uniform_(layer.weight, -(6 / layer.in_features) ** 0.5, (6 / layer.in_features) ** 0.5)
        nn.init.zeros_(layer.bias)
    return net


def auc(labels, scores):
    """The probability that a random click scores above a random non-click (ties: half)."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]  # tied scores share their mean rank
    pos = labels > 0.5
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


def logits(net, embed, ints, ids, tables=None):
    fields = [torch.from_numpy(ids[:, f].astype(np.int64)) for f in range(FIELDS)]
    for f, t in enumerate(tables or []):  # every table's pull in flight at once
        t.prepare(fields[f])
    rows = [embed(f, fields[f]) for f in range(FIELDS)]
    return net(torch.cat([torch.from_numpy(ints)] + rows, dim=1)).squeeze(1)


def score(net, embed, test, batch=4096):
    (labels, ints, ids), _ = test
    with torch.no_grad():
        s = [torch.sigmoid(logits(net, embed, ints[i:i + batch], ids[i:i + batch])).numpy()
             for i in range(0, len(labels), batch)]
    return auc(labels, np.concatenate(s))


def train_worker(opts):
    def work(w):
        (labels, ints, ids), rows = read_criteo(opts.train, w.id, w.num_workers)
        test = read_criteo(opts.test) if w.id == 0 else None
        torch.manual_seed(1)
        net, tables = tower(), [Embedding(w, f) for f in range(FIELDS)]
        sync = DenseSync(w, net, "tower")
        sync.init()
        w.barrier()
        batches = rows // w.num_workers // opts.batch  # the same clocks on every worker (BSP)
        clock, seconds, per_epoch = 0, 0.0, []
        for _ in range(opts.epochs):
            start = time.perf_counter()
            for b in range(batches):
                sl = slice(b * opts.batch, (b + 1) * opts.batch)
                sync.pull()
                net.zero_grad()
                loss = nn.functional.binary_cross_entropy_with_logits(
                    logits(net, lambda f, x: tables[f](x), ints[sl], ids[sl], tables), torch.from_numpy(labels[sl]))
                loss.backward()
                sync.push()
                for t in tables:
                    t.flush()
                clock += 1
                w.tick(clock).wait()
            seconds += time.perf_counter() - start
            w.barrier()
            if test is not None:
                sync.pull()
                per_epoch.append(score(net, lambda f, x: tables[f](x), test))
            w.barrier()
        w.leave().wait()
        out = {"worker": w.id, "samples": batches * opts.batch * opts.epochs, "train_seconds": seconds}
        if test is not None:
            out.update(test_auc=per_epoch[-1], per_epoch=per_epoch)
        with open(os.path.join(opts.results, f"worker{w.id}.json"), "w") as f:
            json.dump(out, f)
        return out
    return work


def train_local(opts):
    """The same model in plain PyTorch, one process: the reference the benchmarks compare with."""
    (labels, ints, ids), _ = read_criteo(opts.train)
    test = read_criteo(opts.test)
    torch.manual_seed(1)
    vocab = [np.unique(np.concatenate([ids[:, f], [0]])) for f in range(FIELDS)]
    net, tables = tower(), nn.ModuleList(nn.Embedding(len(v), DIM) for v in vocab)
    for t in tables:
        nn.init.uniform_(t.weight, -0.01, 0.01)
    dense_opt = torch.optim.Adam(net.parameters(), lr=0.001)
    rows_opt = torch.optim.Adagrad(tables.parameters(), lr=0.05, eps=0.01)

    def embed(f, x):  # ids the training file never had are row 0's
        idx = np.searchsorted(vocab[f], x.numpy().astype(np.uint64)).clip(0, len(vocab[f]) - 1)
        idx[vocab[f][idx] != x.numpy().astype(np.uint64)] = 0
        return tables[f](torch.from_numpy(idx))

    start, batches = time.perf_counter(), len(labels) // opts.batch
    for _ in range(opts.epochs):
        for b in range(batches):
            sl = slice(b * opts.batch, (b + 1) * opts.batch)
            dense_opt.zero_grad()
            rows_opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(logits(net, embed, ints[sl], ids[sl]),
                                                           torch.from_numpy(labels[sl])).backward()
            dense_opt.step()
            rows_opt.step()
    seconds = time.perf_counter() - start
    return {"test_auc": score(net, embed, test), "samples_per_s": batches * opts.batch * opts.epochs / seconds,
            "mode": "local", "status": "ok"}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--local", action="store_true")
    opts, job_flags = p.parse_known_args()
    for path in (opts.train, opts.test):
        if not os.path.isfile(path):
            raise SystemExit(f"ctr_torch: cannot read {path}")
    if opts.local:
        print(json.dumps(train_local(opts)))
        return 0
    opts.results = os.environ.setdefault("CTR_TORCH_RESULTS", tempfile.mkdtemp(prefix="ctr_torch."))
    tables = [actorps.Table(f"C{f + 1}", DIM, rule="adagrad", lr=0.05, eps=0.01) for f in range(FIELDS)]
    size = sum(p.numel() for p in tower().parameters())
    lr = [] if any(a.startswith("--lr=") for a in job_flags) else ["--lr=0.001"]
    status = actorps.run(train_worker(opts), name="ctr_torch", tensors=[actorps.Tensor("tower", size)],
                         tables=tables, rule="adam", consistency="bsp",
                         args=[f"--epochs={opts.epochs}", f"--batch={opts.batch}"] + lr + job_flags,
                         script_args=[f"--train={opts.train}", f"--test={opts.test}"])
    if any(a.startswith("--role=") and a != "--role=local" for a in job_flags):
        return status
    found = [json.load(open(os.path.join(opts.results, n))) for n in sorted(os.listdir(opts.results))]
    line = {"status": "ok" if status == 0 else "failed"}
    if found:
        seconds = max(r["train_seconds"] for r in found)
        line.update(test_auc=found[0].get("test_auc"), per_epoch=found[0].get("per_epoch"),
                    samples_per_s=sum(r["samples"] for r in found) / seconds if seconds else 0)
    print(json.dumps(line))
    return status


if __name__ == "__main__":
    sys.exit(main())
