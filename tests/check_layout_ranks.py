#!/usr/bin/python3
"""Checks the output of a job launched with --layout=servers:S,workers:W (Slurm, MPI): every
rank's status line is there once, names its rank and the role the layout gives it, and says
"ok"; worker 0's result (printed by the coordinator) reaches the accuracy floor. Exits 1
naming what is wrong.
usage: check_layout_ranks.py OUTPUT_FILE SERVERS WORKERS MIN_ACCURACY"""
import json
import sys


def main():
    path, servers, workers, floor = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    lines = []
    for text in open(path, errors="replace"):
        text = text.strip()
        if text.startswith("{"):
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                sys.exit(f"{path}: a torn JSON line: {text!r}")
    by_rank = {}
    for line in lines:
        if "rank" in line:
            if line["rank"] in by_rank:
                sys.exit(f"rank {line['rank']} printed two status lines")
            by_rank[line["rank"]] = line
    problems = []
    for rank in range(1 + servers + workers):
        role = "coordinator" if rank == 0 else "server" if rank <= servers else "worker"
        line = by_rank.get(rank)
        if line is None:
            problems.append(f"no status line from rank {rank}")
        elif line.get("role") != role or line.get("status") != "ok":
            problems.append(f"rank {rank}: expected role {role} and status ok, got {json.dumps(line)}")
    results = [l for l in lines if l.get("worker") == 0 and "test_accuracy" in l]
    if not results:
        problems.append("no result line of worker 0 with test_accuracy")
    elif results[0]["test_accuracy"] < floor:
        problems.append(f"test_accuracy {results[0]['test_accuracy']} below {floor}")
    coordinator = by_rank.get(0, {})
    if coordinator.get("workers_reporting") != workers:
        problems.append(f"the coordinator heard from {coordinator.get('workers_reporting')} workers, not {workers}")
    if problems:
        sys.exit("\n".join(problems))
    print(f"{len(by_rank)} ranks ok, test_accuracy {results[0]['test_accuracy']:.4f}")


main()
