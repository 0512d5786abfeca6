#!/usr/bin/env bash
# psctl rolling-restart replaces every server of a running job, one at a time: a new server
# joins and takes its share, then the old shard leaves and its process exits 0. A clocksum
# job under BSP (3 servers, 2 workers, 20 ms of "compute" a clock) holds at clock 290 until the map holds exactly the
# three new shards (3, 4, 5), so the restart runs while the workers push and pull whatever
# the machine's speed; the job must end ok with exact sums on the new shards, no stale read,
# and the consistency trace (every shard's, the new ones' too) checked against the bound. Usage: rolling_restart.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/roles_by_hand.sh"
start_coordinator coord "$bin/psnode" --role=coordinator --app=clocksum --clocks=300 --clock-ms=20 --consistency=bsp \
  --hold-at-clock=290 --hold-for-shards=[3,4,5] --trace="$work/trace.jsonl" --host=127.0.0.1 --port=0 --servers=3 \
  --workers=2 --log-level=info
servers=()
for s in 0 1 2; do
  "$bin/psnode" --role=server "${join[@]}" --trace="$work/trace.jsonl" >"$work/server$s.out" 2>"$work/server$s.err" &
  servers+=($!)
done
pids+=("${servers[@]}")
for w in 0 1; do
  "$bin/psnode" --role=worker --app=clocksum "${join[@]}" >"$work/worker$w.out" 2>"$work/worker$w.err" &
  pids+=($!)
done
await_line "$work/coord.err" "[worker 1] clock" "$coord" 60 || { cat "$work/coord.err"; echo "the job never ran"; exit 1; }
new_server="$bin/psnode --role=server ${join[*]} --trace=$work/trace.jsonl >>$work/new_servers.out 2>>$work/new_servers.err"
timeout 300 "$bin/psctl" "${join[1]}" rolling-restart --start="$new_server" >"$work/psctl.out" 2>"$work/psctl.err" ||
  { cat "$work/psctl.out" "$work/psctl.err" "$work/coord.err"; echo "rolling-restart failed"; exit 1; }
grep -q '"shards_after":\[3,4,5\]' "$work/psctl.out" || { cat "$work/psctl.out" "$work/coord.err"; echo "not replaced by 3, 4, 5"; exit 1; }
for pid in "${servers[@]}"; do
  code=0
  wait "$pid" || code=$?
  [ "$code" -eq 0 ] || { cat "$work"/server*.out; echo "an old server exited $code"; exit 1; }
done
wait "$coord" || { cat "$work/coord.err"; echo "the coordinator failed"; exit 1; }
results=$(grep '"shard_values"' "$work/coord.out")
[ "$(wc -l <<<"$results")" -eq 2 ] || { cat "$work/coord.out"; echo "not two worker results"; exit 1; }
grep -q '"shard_values":{"3":900,"4":900,"5":900}' <<<"$results" || { echo "$results"; echo "sums not exact"; exit 1; }
if grep -v '"stale_reads":0' <<<"$results"; then echo "stale reads under BSP"; exit 1; fi
PYTHONPATH="$bin/../python" /usr/bin/python3 - "$work/trace.jsonl" <<'PY'
import sys, actorps
r = actorps.check_trace(sys.argv[1])
assert r["pulls"] > 0 and not r["violations"], r
print(f"trace: {r['pushes']} pushes, {r['pulls']} pulls, max lag {r['max_lag']}, no read broke the bound")
PY
sed -n 's/.*"seconds":\([0-9.]*\).*/replaced in \1 s/p' "$work/psctl.out"
echo "rolling-restart: 3 servers replaced during the job; exact sums, no stale read"
