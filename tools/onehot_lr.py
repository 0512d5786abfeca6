#!/usr/bin/env python3
"""A reference for train_ctr's AUC: one-hot logistic regression (a weight per (field, id),
per integer feature on log(1 + x), and a bias), one pass of per-sample Adagrad, over files
in Criteo's TSV format; prints the test AUC. The model class of gen_ctr's truth, so it
says what the training rows can teach, apart from any system. Pure Python, no packages.
With --cross it also has a weight per pair of ids of fields C1 x C2 and C3 x C4: then it
is exactly the model class of gen_ctr's truth (its two interactions).

    tools/onehot_lr.py TRAIN.tsv TEST.tsv [LR=0.05] [EPOCHS=1] [--cross]
"""
import math
import sys


def rows(path, cross):
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        ints = [math.log1p(max(0, int(v))) if v else 0.0 for v in f[1:14]]
        c = f[14:40]
        cats = [(i, v) for i, v in enumerate(c) if v]
        if cross:
            cats += [("x", a, c[a], c[a + 1]) for a in (0, 2) if c[a] and c[a + 1]]
        yield int(f[0]), ints, cats


def auc(scores, labels):
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    pos = sum(labels)
    rank_sum = sum(r for r, i in enumerate(order, 1) if labels[i])
    return (rank_sum - pos * (pos + 1) / 2) / (pos * (len(labels) - pos))


def main():
    cross = "--cross" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--cross"]
    if len(args) < 2:
        sys.exit(__doc__)
    train, test = args[0], args[1]
    lr = float(args[2]) if len(args) > 2 else 0.05
    epochs = int(args[3]) if len(args) > 3 else 1
    w, g2 = {}, {}
    wi, gi = [0.0] * 13, [1e-8] * 13
    bias, gb = 0.0, 1e-8

    def logit(ints, cats):
        return bias + sum(a * b for a, b in zip(wi, ints)) + sum(w.get(c, 0.0) for c in cats)

    for _ in range(epochs):
        for y, ints, cats in rows(train, cross):
            p = 1 / (1 + math.exp(-max(-30.0, min(30.0, logit(ints, cats)))))
            g = p - y
            gb += g * g
            bias -= lr * g / math.sqrt(gb)
            for k in range(13):
                gk = g * ints[k]
                gi[k] += gk * gk
                wi[k] -= lr * gk / math.sqrt(gi[k])
            for c in cats:
                g2[c] = g2.get(c, 1e-8) + g * g
                w[c] = w.get(c, 0.0) - lr * g / math.sqrt(g2[c])
    scores, labels = [], []
    for y, ints, cats in rows(test, cross):
        scores.append(logit(ints, cats))
        labels.append(y)
    print('{"reference":"onehot_lr","cross":%s,"epochs":%d,"test_auc":%.4f}'
          % ("true" if cross else "false", epochs, auc(scores, labels)))


if __name__ == "__main__":
    main()
