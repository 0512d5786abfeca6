#!/usr/bin/env python3
"""A reference for train_ctr's AUC: one-hot logistic regression (a weight per (field, id),
per integer feature on log(1 + x), and a bias), one pass of per-sample Adagrad, over files
in Criteo's TSV format; prints the test AUC. The model class of gen_ctr's truth, so it
says what the training rows can teach, apart from any system. Pure Python, no packages.

    tools/onehot_lr.py TRAIN.tsv TEST.tsv [LR=0.05] [EPOCHS=1]
"""
import math
import sys


def rows(path):
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        ints = [math.log1p(max(0, int(v))) if v else 0.0 for v in f[1:14]]
        cats = [(i, v) for i, v in enumerate(f[14:40]) if v]
        yield int(f[0]), ints, cats


def auc(scores, labels):
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    pos = sum(labels)
    rank_sum = sum(r for r, i in enumerate(order, 1) if labels[i])
    return (rank_sum - pos * (pos + 1) / 2) / (pos * (len(labels) - pos))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    train, test = sys.argv[1], sys.argv[2]
    lr = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    w, g2 = {}, {}
    wi, gi = [0.0] * 13, [1e-8] * 13
    bias, gb = 0.0, 1e-8

    def logit(ints, cats):
        return bias + sum(a * b for a, b in zip(wi, ints)) + sum(w.get(c, 0.0) for c in cats)

    for _ in range(epochs):
        for y, ints, cats in rows(train):
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
    for y, ints, cats in rows(test):
        scores.append(logit(ints, cats))
        labels.append(y)
    print('{"reference":"onehot_lr","test_auc":%.4f}' % auc(scores, labels))


if __name__ == "__main__":
    main()
