"""examples/python/ctr_torch.py on small generated data (gen_ctr, 100,000 training rows,
10,000 test rows): embedded, its test AUC within 0.01 of train_ctr's on the same files,
epochs and cluster (three runs each measured 0.7669-0.7673 against 0.7663-0.7667; on
20,000 rows one epoch is 39 clocks and the AUC moved by 0.025 from run to run)."""
import json
import os
import subprocess
import sys

import pytest

BIN = os.environ.get("ACTORPS_BIN")
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python", "ctr_torch.py")
pytestmark = pytest.mark.skipif(not BIN, reason="ACTORPS_BIN (build/bin) not set: run through ctest")


def last_json(stdout):
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def test_ctr_torch_trains_to_train_ctrs_auc(tmp_path):
    subprocess.run([os.path.join(BIN, "gen_ctr"), f"--out={tmp_path}", "--train-rows=100000", "--test-rows=10000"],
                   check=True, capture_output=True)
    files = [f"--train={tmp_path}/train.tsv", f"--test={tmp_path}/test.tsv", "--cluster=embedded"]
    cpp = subprocess.run([os.path.join(BIN, "train_ctr")] + files, capture_output=True, text=True, timeout=300)
    assert cpp.returncode == 0, cpp.stderr[-2000:]
    torch_run = subprocess.run([sys.executable, EXAMPLE] + files, capture_output=True, text=True, timeout=300)
    assert torch_run.returncode == 0, torch_run.stderr[-2000:]
    mine, theirs = last_json(torch_run.stdout), last_json(cpp.stdout)
    assert mine["status"] == "ok" and mine["samples_per_s"] > 0
    assert abs(mine["test_auc"] - theirs["test_auc"]) <= 0.01, (mine, theirs["test_auc"])
