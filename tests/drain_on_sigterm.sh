#!/usr/bin/env bash
# A server told to stop by SIGTERM (as Slurm and Kubernetes do before they kill) while its
# job runs on leaves it: its shard's keys go to the others, as psctl remove-shard moves
# them, and it exits 0 within 10 s with a last line that says so; the job ends ok on the
# two other shards with exact sums and no stale read (clocksum under BSP). The workers
# hold at clock 100 until the map holds shards 0 and 2 only, so the signal lands mid-job
# whatever the machine's speed. Below: the last shard, which cannot leave, and a worker,
# which leaves at its next tick. Usage: drain_on_sigterm.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/roles_by_hand.sh"
start_coordinator coord "$bin/psnode" --role=coordinator --app=clocksum --clocks=200 --consistency=bsp \
  --hold-at-clock=100 --hold-for-shards=[0,2] --host=127.0.0.1 --port=0 --servers=3 --workers=2 --log-level=info
start_members "" 3 2 "$bin/psnode"
await_line "$work/coord.err" "holding at clock 100" "$coord" 60 || { cat "$work/coord.err"; echo "the workers never held"; exit 1; }
stop_member "$work/coord.err" "server shard 1"
[ "$code" -eq 0 ] || { echo "the signalled server exited $code"; exit 1; }
out=$(grep -l '"drained"' "$work"/server*.out) || { cat "$work"/server*.out "$work"/server*.err; echo "no server said it drained"; exit 1; }
grep -q '"status":"ok"' "$out" || { cat "$out"; echo "the drained server did not end ok"; exit 1; }
[ "$took_ms" -le 10000 ] || { echo "the server took $took_ms ms to leave (more than 10 s)"; exit 1; }
wait "$coord" || { cat "$work/coord.err"; echo "the coordinator failed"; exit 1; }
results=$(grep '"shard_values"' "$work/coord.out")
[ "$(wc -l <<<"$results")" -eq 2 ] || { cat "$work/coord.out"; echo "not two worker results"; exit 1; }
# 200 clocks of 1 + 2 per key, all on shards 0 and 2; no pull saw less than its clock's sum.
grep -q '"shard_values":{"0":600,"2":600}' <<<"$results" || { echo "$results"; echo "sums not exact on shards 0 and 2"; exit 1; }
if grep -v '"stale_reads":0' <<<"$results"; then echo "stale reads under BSP"; exit 1; fi
echo "SIGTERM: shard 1's server left in $took_ms ms, exit 0; the job ended ok on shards 0 and 2, exact"

# The last shard cannot leave: the job stops as on the coordinator's SIGTERM (every member
# exits 143) and the server says why. The workers hold for a map that never comes.
start_coordinator last "$bin/psnode" --role=coordinator --app=clocksum --clocks=200 --hold-at-clock=20 \
  --hold-for-shards=[7] --host=127.0.0.1 --port=0 --servers=1 --workers=1 --log-level=info
"$bin/psnode" --role=server "${join[@]}" >"$work/last_server.out" 2>"$work/last_server.err" &
server=$!
"$bin/psnode" --role=worker --app=clocksum "${join[@]}" >"$work/last_worker.out" 2>"$work/last_worker.err" &
pids+=("$server" $!)
await_line "$work/last.err" "holding at clock 20" "$coord" 60 || { cat "$work/last.err"; echo "the worker never held"; exit 1; }
kill -TERM "$server"
code=0
wait "$server" || code=$?
[ "$code" -eq 143 ] || { cat "$work/last_server.out"; echo "the last shard's server exited $code, not 143"; exit 1; }
grep -q "shard 0 cannot leave: it is the last shard" "$work/last_server.out" ||
  { cat "$work/last_server.out"; echo "the server did not say why it could not leave"; exit 1; }
code=0
wait "$coord" || code=$?
[ "$code" -eq 143 ] || { cat "$work/last.out"; echo "the coordinator exited $code, not 143"; exit 1; }
echo "SIGTERM on the last shard: the job stopped, every member 143, the reason named: PASS"

# A worker told to stop leaves the job at its next tick: out of the clock vector, its
# pushes so far counted. It exits 0 within 10 s saying where it left, and the job ends ok
# with the other worker: every key holds 400 * 1 + L * 2 (L: the clocks worker 1 pushed).
# --clock-ms keeps the job running for 8 s at least, so the signal lands mid-job.
start_coordinator leave "$bin/psnode" --role=coordinator --app=clocksum --clocks=400 --clock-ms=20 --consistency=bsp \
  --host=127.0.0.1 --port=0 --servers=2 --workers=2 --log-level=info
start_members leave_ 2 2 "$bin/psnode"
await_line "$work/leave.err" "[worker 1] clock" "$coord" 60 || { cat "$work/leave.err"; echo "worker 1 never reported"; exit 1; }
stop_member "$work/leave.err" "worker 1"
out=$(grep -l '"left"' "$work"/leave_worker*.out) || { cat "$work"/leave_worker*; echo "no worker said it left"; exit 1; }
[ "$code" -eq 0 ] && grep -q '"status":"ok"' "$out" || { cat "$out"; echo "the signalled worker exited $code"; exit 1; }
[ "$took_ms" -le 10000 ] || { echo "the worker took $took_ms ms to leave (more than 10 s)"; exit 1; }
wait "$coord" || { cat "$work/leave.err"; echo "the coordinator failed"; exit 1; }
/usr/bin/python3 - "$work/leave.out" <<'PY' || exit 1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
left = next(l for l in lines if l.get("worker") == 1)
stayed = next(l for l in lines if l.get("worker") == 0)
end = lines[-1]
L = left["left_before_clock"]
want = {s: 400 + 2 * L for s in stayed["shard_values"]}
assert 0 < L < 400, f"worker 1 left before clock {L}: not mid-job"
assert end["status"] == "ok" and end["workers_reporting"] == 2, end
assert stayed["shard_values"] == want, f"sums {stayed['shard_values']}, expected {want}"
print(f"worker 1 left before clock {L}; every key holds {400 + 2 * L}")
PY
echo "SIGTERM on a worker: it left in $took_ms ms, exit 0; the job ended ok with exact sums"
