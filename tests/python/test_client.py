"""The Python client on an embedded job (every role in this process): exact sums, pulls
that land in place, rows with their first-touch values, errors with the client's
messages, the GIL released while a request or a barrier waits. Run by ctest (python)."""
import threading

import numpy as np
import pytest

import actorps

N = 1000
EMBEDDED = ["--cluster=embedded", "--servers=2", "--workers=2"]


def run_job(name, work, **kw):
    results, errors = {}, []

    def worker(w):
        try:
            results[w.id] = work(w)
        except Exception as e:  # noqa: BLE001 - the test reports what the worker hit
            errors.append(f"worker {w.id}: {type(e).__name__}: {e}")
            raise
        return {"worker": w.id}

    status = actorps.run(worker, name=name, args=EMBEDDED, **kw)
    return status, results, errors


def test_push_and_pull_exact_sums():
    def work(w):
        w.push("w", np.full(N, w.id + 1, np.float32)).wait()
        w.barrier()
        sums = w.pull("w").result()
        w.barrier()
        return sums

    status, results, errors = run_job("py_sums", work, tensors=[actorps.Tensor("w", N)])
    assert status == 0, errors
    for sums in results.values():
        assert sums.dtype == np.float32 and sums.shape == (N,)
        assert np.all(sums == 3.0)


def test_pull_lands_in_the_buffer_given_and_a_buffer_is_pushed_without_copy():
    def work(w):
        mine = actorps.buffer(N)
        mine[:] = w.id + 1
        w.push("w", mine).wait()
        w.barrier()
        out = actorps.buffer(N)
        address = out.ctypes.data
        got = w.pull("w", out=out).result()
        w.barrier()
        return got is out, got.ctypes.data == address, float(got[0]), float(got[-1])

    status, results, errors = run_job("py_in_place", work, tensors=[actorps.Tensor("w", N)])
    assert status == 0, errors
    for same, same_address, first, last in results.values():
        assert same and same_address
        assert first == 3.0 and last == 3.0


def test_rows_are_created_from_their_first_touch_values():
    ids = np.array([7, 1 << 40, 2**63 + 5], dtype=np.uint64)

    def work(w):
        first = w.pull_rows(0, ids).result()
        w.barrier()
        w.push_rows(0, ids, np.ones((len(ids), 4), np.float32)).wait()
        w.barrier()
        after = w.pull_rows(0, ids).result()
        w.barrier()
        return first, after

    table = actorps.Table("emb", 4, init_scale=0.5, seed=7)
    status, results, errors = run_job("py_rows", work, tables=[table])
    assert status == 0, errors
    (first0, after0), (first1, after1) = results[0], results[1]
    assert first0.shape == (3, 4)
    assert np.array_equal(first0, first1)  # a function of (seed, table, id) alone
    assert np.all(np.abs(first0) <= 0.5) and np.any(first0 != 0)
    assert np.allclose(after0, first0 + 2) and np.array_equal(after0, after1)


def test_errors_carry_the_client_message():
    def work(w):
        caught = []
        for call in (lambda: w.pull("nope"),
                     lambda: w.push("w", np.ones(3, np.float32)),
                     lambda: w.push("w", np.ones(N, np.float64)),
                     lambda: w.pull_rows(5, np.array([1], np.uint64))):
            with pytest.raises(actorps.Error) as e:
                call()
            caught.append(str(e.value))
        with pytest.raises(actorps.Error) as e:
            w.pull("w").result()  # nobody pushed to w
        caught.append(str(e.value))
        failed_into = actorps.buffer(N)
        with pytest.raises(actorps.Error):
            w.pull("w", out=failed_into).result()
        with pytest.raises(actorps.Error) as e:  # parts of the failed pull may still land there
            w.pull("w", out=failed_into)
        caught.append(str(e.value))
        with pytest.raises(actorps.Error) as e:
            w.pull_rows(0, np.array([-1]))
        caught.append(str(e.value))
        kept.append(w)
        w.barrier()
        return caught

    kept = []
    status, results, errors = run_job("py_errors", work, tensors=[actorps.Tensor("w", N)])
    assert status == 0, errors
    caught = results[0]
    assert "a pull into this buffer failed" in caught[5]
    assert "row id -1 is negative" in caught[6]
    with pytest.raises(actorps.Error, match="this worker's job has ended"):
        kept[0].pull("w")
    assert 'no tensor "nope" in this job (its tensors: w)' in caught[0]
    assert "push to w: 3 values for 1000" in caught[1]
    assert "values must be a float32 array, not float64" in caught[2]
    assert "no sparse table 5 (the job has 0)" in caught[3]
    assert "were never pushed or initialized" in caught[4]


def test_waits_release_the_gil():
    # Worker 1 reaches the barrier only once a Python thread of worker 0 has counted
    # SPINS while worker 0 waits in it. Were the barrier to hold the GIL, no Python thread
    # could run during it (the count cannot reach SPINS in the few bytecodes before it),
    # worker 1 would never arrive, and the barrier would fail at its timeout.
    SPINS = 200_000
    waiting, counted = threading.Event(), threading.Event()

    def work(w):
        if w.id == 1:
            if not counted.wait(timeout=60):
                raise RuntimeError("worker 0's thread did not run while worker 0 waited in the barrier")
            w.barrier()
            return 0
        count, stop = [0], threading.Event()

        def spin():
            waiting.wait()
            start = count[0]
            while not stop.is_set():
                count[0] += 1
                if count[0] - start == SPINS:
                    counted.set()

        t = threading.Thread(target=spin)
        t.start()
        waiting.set()
        w.barrier()  # waits for worker 1, which waits for the spinning thread
        stop.set()
        t.join()
        return count[0]

    status, results, errors = run_job("py_gil", work, tensors=[actorps.Tensor("w", N)])
    assert status == 0, errors
    assert results[0] >= SPINS


def test_a_worker_that_raises_fails_the_job_with_its_message(capfd):
    def work(w):
        raise ValueError("the data file is missing")

    status, _, _ = run_job("py_raises", work, tensors=[actorps.Tensor("w", N)])
    assert status != 0
    assert "the data file is missing" in capfd.readouterr().err


def test_the_module_matches_its_native_library():
    assert actorps.__version__ == actorps._native.__version__
    assert actorps._native.protocol_version >= 5


def test_ssp_through_python_ticks_keeps_its_bound(tmp_path):
    trace = tmp_path / "trace.jsonl"

    def work(w):
        for c in range(12):
            w.pull("w").result()  # at clock c: answered once the other worker is within 1 clock
            w.push("w", np.ones(N, np.float32)).wait()
            w.tick(c + 1).wait()
        w.leave().wait()
        w.barrier()

    def init_then_work(w):
        if w.id == 0:
            w.init("w", np.zeros(N, np.float32)).wait()
        w.barrier()
        work(w)

    status = actorps.run(init_then_work, name="py_ssp", tensors=[actorps.Tensor("w", N)], consistency="ssp",
                         args=EMBEDDED + ["--staleness=1", f"--trace={trace}"])
    assert status == 0
    report = actorps.check_trace(str(trace))
    assert report["violations"] == []
    assert report["pulls"] >= 2 * 12 * 2  # every pull of both workers, on both shards
    assert report["max_lag"] <= 1


def test_a_buffer_is_free_again_once_its_request_is_waited_for():
    def work(w):
        buf = actorps.buffer(N)
        if w.id == 0:
            w.init("w", buf).wait()
        w.barrier()
        for _ in range(200):  # each result() gives the buffer back before it returns
            w.pull("w", out=buf).result()
            w.push("w", buf).wait()
        w.barrier()
        return True

    status, results, errors = run_job("py_reuse", work, tensors=[actorps.Tensor("w", N)])
    assert status == 0, errors
    assert results == {0: True, 1: True}


def test_a_request_kept_past_its_job_raises_instead_of_waiting_forever():
    kept = []

    def work(w):
        if w.id == 0:
            kept.append(w.pull("w"))  # never waited for inside the job: w was not pushed
        w.barrier()

    status, _, errors = run_job("py_kept", work, tensors=[actorps.Tensor("w", N)])
    assert status == 0, errors
    with pytest.raises(actorps.Error):  # answered with its failure, or its job ended before it was
        kept[0].result()
