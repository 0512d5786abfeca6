#!/usr/bin/python3
"""Draws a job's --metrics file (JSON lines) into one PNG: loss against time and epoch,
accuracy or AUC per epoch, throughput and the workers' clock spread (observed staleness)
against time. Debian's matplotlib (python3-matplotlib), no display needed.

    ./run plot FILE [OUT.png]      (OUT defaults to FILE with .png)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    progress, epochs = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot: {path}:{number}: not a JSON line ({e.msg})")
            kind = row.get("type") if isinstance(row, dict) else None
            if kind == "progress":
                progress.append(row)
            elif kind == "epoch":
                epochs.append(row)
    if not progress and not epochs:
        sys.exit(f"plot: {path} has no progress or epoch lines (is it a --metrics file?)")
    return progress, epochs


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else path.rsplit(".", 1)[0] + ".png"
    try:
        progress, epochs = read(path)
    except OSError as e:
        sys.exit(f"plot: cannot read {path}: {e.strerror}")
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    trained = [p for p in progress if "loss" in p]  # lines before the first report have none
    ax[0][0].plot([p["elapsed_s"] for p in trained], [p["loss"] for p in trained], ".-", label="workers' recent loss")
    ax[0][0].plot([e["elapsed_s"] for e in epochs], [e["loss"] for e in epochs], "o", label="epoch mean")
    ax[0][0].set(xlabel="seconds", ylabel="loss", title="loss")
    ax[0][0].legend()
    metric = next((m for m in ("accuracy", "auc") if any(m in e for e in epochs)), None)
    if metric:
        ax[0][1].plot([e["epoch"] for e in epochs if metric in e], [e[metric] for e in epochs if metric in e], "o-")
    ax[0][1].set(xlabel="epoch", ylabel=metric or "(no evaluation)", title=f"test {metric or ''} per epoch")
    recent = [p for p in progress if "samples_per_s_recent" in p]
    ax[1][0].plot([p["elapsed_s"] for p in recent], [p["samples_per_s_recent"] for p in recent], ".-",
                  label="since the line before")
    ax[1][0].plot([e["elapsed_s"] for e in epochs], [e["samples_per_s"] for e in epochs], "o", label="per epoch")
    ax[1][0].set(xlabel="seconds", ylabel="samples/s", title="throughput")
    ax[1][0].legend()
    spread = [(p["elapsed_s"], p["clock_spread"]) for p in progress if "clock_spread" in p]
    ax[1][1].step([s[0] for s in spread], [s[1] for s in spread], where="post")
    ax[1][1].set(xlabel="seconds", ylabel="clocks", title="fastest minus slowest worker's clock")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(json.dumps({"plot": out, "progress_lines": len(progress), "epoch_lines": len(epochs)}))


if __name__ == "__main__":
    main()
