"""A Python job as processes: the script starts copies of itself as servers and workers
(python3 sums_job.py --role=server ...), and as roles started by hand."""
import json
import os
import subprocess
import sys

import pytest

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


def start_coordinator(command):
    """The coordinator of a job of one server and one worker, and the flags that join it."""
    coord = subprocess.Popen(command + ["--host=127.0.0.1", "--port=0", "--servers=1", "--workers=1",
                                        "--log-level=info"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in coord.stderr:
        if "coordinator listening on" in line:
            port = line.split("coordinator listening on ")[1].split(",")[0].rsplit(":", 1)[1]
            return coord, ["--host=127.0.0.1", f"--coordinator=127.0.0.1:{port}"]
    coord.kill()
    raise AssertionError("the coordinator never said where it listens")


def run_by_hand(coordinator, server):
    """The job from the COORDINATOR and SERVER commands, this script its worker."""
    coord, join = start_coordinator(coordinator)
    try:
        server = subprocess.Popen(server + ["--role=server"] + join, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        worker = subprocess.run([sys.executable, JOB, "--role=worker"] + join, capture_output=True, text=True,
                                timeout=60)
        assert worker.returncode == 0, worker.stderr
        out, _ = coord.communicate(timeout=60)
        server.wait(timeout=30)
        assert coord.returncode == 0
        assert results_of(out) == [{"worker": 0, "sum": 1.0, "right": True}]
    finally:
        coord.kill()


def test_a_script_runs_as_roles_started_by_hand():
    run_by_hand([sys.executable, JOB, "--role=coordinator"], [sys.executable, JOB])


def job_file(tmp_path):
    described = subprocess.run([sys.executable, JOB, "--role=describe", "--servers=1", "--workers=1"],
                               capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    job = json.loads(described.stdout)
    assert job["app"] == "sums_job"
    assert [t["name"] for t in job["tensors"]] == ["w"] and job["tables"][0]["dim"] == 4
    path = tmp_path / "job.json"
    path.write_text(described.stdout)
    return path


PSNODE = os.path.join(os.environ.get("ACTORPS_BIN", "build/bin"), "psnode")
needs_psnode = pytest.mark.skipif(not os.path.exists(PSNODE), reason="needs psnode (ACTORPS_BIN: the build's bin/)")


@needs_psnode
def test_psnode_coordinates_a_script_from_its_job_file(tmp_path):
    # Neither the coordinator nor the server runs Python; the worker is the script.
    run_by_hand([PSNODE, "--role=coordinator", f"--job-file={job_file(tmp_path)}"], [PSNODE])


@needs_psnode
def test_a_worker_unlike_the_job_file_is_refused(tmp_path):
    coord, join = start_coordinator([PSNODE, "--role=coordinator", f"--job-file={job_file(tmp_path)}"])
    try:
        worker = subprocess.run([sys.executable, JOB, "--role=worker", "--staleness=3"] + join, capture_output=True,
                                text=True, timeout=60)
        assert worker.returncode != 0
        assert "--staleness=3 (the job has inf)" in worker.stderr
        out, _ = coord.communicate(timeout=60)
        assert coord.returncode != 0 and "--staleness=3 (the job has inf)" in out
    finally:
        coord.kill()


@needs_psnode
def test_a_bad_job_file_is_refused_naming_it(tmp_path):
    job = json.loads(job_file(tmp_path).read_text())
    del job["tables"][0]["dim"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(job))
    done = subprocess.run([PSNODE, "--role=coordinator", f"--job-file={path}"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert f'--job-file={path}: tables[0] has no "dim"' in done.stderr


def test_launch_runs_a_script_as_a_local_job():
    done = subprocess.run([sys.executable, "-m", "actorps.launch", "--servers=2", "--workers=2", JOB],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(r["worker"] for r in results_of(done.stdout)) == [0, 1]
