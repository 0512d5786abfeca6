"""A Python job as processes: the script starts copies of itself as servers and workers
(python3 sums_job.py --role=server ...), and as roles started by hand."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "sums_job.py")


def results_of(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"') and '"right"' in line]


def test_a_script_runs_as_a_local_cluster_of_its_own_processes():
    done = subprocess.run([sys.executable, JOB, "--servers=2", "--workers=3"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    results = results_of(done.stdout)
    assert sorted(r["worker"] for r in results) == [0, 1, 2]
    assert all(r["sum"] == 6.0 for r in results)


def test_a_script_runs_as_roles_started_by_hand():
    coord = subprocess.Popen([sys.executable, JOB, "--role=coordinator", "--host=127.0.0.1", "--port=0",
                              "--servers=1", "--workers=1", "--log-level=info"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in coord.stderr:
            if "coordinator listening on" in line:
                port = line.split("coordinator listening on ")[1].split(",")[0].rsplit(":", 1)[1]
                break
        assert port, "the coordinator never said where it listens"
        join = ["--host=127.0.0.1", f"--coordinator=127.0.0.1:{port}"]
        server = subprocess.Popen([sys.executable, JOB, "--role=server"] + join, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        worker = subprocess.run([sys.executable, JOB, "--role=worker"] + join, capture_output=True, text=True,
                                timeout=60)
        assert worker.returncode == 0, worker.stderr
        out, _ = coord.communicate(timeout=60)
        server.wait(timeout=30)
        assert coord.returncode == 0
        assert results_of(out) == [{"worker": 0, "sum": 1.0, "right": True}]
    finally:
        coord.kill()


def test_launch_runs_a_script_as_a_local_job():
    done = subprocess.run([sys.executable, "-m", "actorps.launch", "--servers=2", "--workers=2", JOB],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(r["worker"] for r in results_of(done.stdout)) == [0, 1]
