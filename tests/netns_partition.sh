#!/usr/bin/env bash
# Fault test (f): coordinator, two servers and two workers, each in its own network
# namespace, joined by veth pairs to a bridge. Mid-run one server's link is cut
# (ip link set ... down: TCP is not reset, the peer just goes silent). Checks that the
# cut is detected (--ps.failure-timeout-ms; the time is printed), that the chain (--replication=2)
# closes over the lost server, and that the job's result is exactly the fault-free one.
# Needs root (as CI has); exits 77 (ctest: skipped) without it.
set -euo pipefail
bin=$(cd "$1" && pwd)
source "$(dirname "$0")/netns_lib.sh"
nodes=(c s0 s1 w0 w1)
netns_hosts "${nodes[@]}"
addr() { netns_addr "$1"; }

detect_ms=1500
common=(--app=clocksum --servers=2 --workers=2 --replication=2 --ps.heartbeat-ms=200 --clocks=150 --clock-ms=20
        --ps.failure-timeout-ms=$detect_ms)
coord="$(addr 0):7000"
run_in c coord.log "$bin/psnode" --role=coordinator --host="$(addr 0)" --port=7000 "${common[@]}"
coordinator=$!
# The coordinator is up once it prints its address.
wait_for "$work/coord.log" "coordinator listening" 20 || { cat "$work/coord.log"; exit 1; }
run_in s0 s0.log "$bin/psnode" --role=server --host="$(addr 1)" --coordinator="$coord" "${common[@]}"
run_in s1 s1.log "$bin/psnode" --role=server --host="$(addr 2)" --coordinator="$coord" "${common[@]}"
run_in w0 w0.log "$bin/psnode" --role=worker --host="$(addr 3)" --coordinator="$coord" "${common[@]}"
w0=$!
run_in w1 w1.log "$bin/psnode" --role=worker --host="$(addr 4)" --coordinator="$coord" "${common[@]}"
w1=$!

# Training is under way once a worker reports progress; then cut server s1's link.
wait_for "$work/coord.log" "clock " 30 || { cat "$work"/*.log; exit 1; }
t0=$(date +%s%N)
ip -n "${tag}_s1" link set "e2$tag" down
wait_for "$work/coord.log" "went down" 20 || { echo "cut never detected"; cat "$work"/*.log; exit 1; }
t1=$(date +%s%N)
detected=$(( (t1 - t0) / 1000000 ))
echo "netns: link of server 192.0.2.12 cut; coordinator declared it dead after $detected ms (failure timeout $detect_ms ms)"

# The workers and then the coordinator end by themselves: the coordinator acknowledges a
# worker's result before its log prints it, so the results are read only once it has
# exited. Should they not end within 80 s, the watchdog shows where everyone is and ends
# them (ctest would otherwise kill this script at 120 s, silently).
( sleep 80 >/dev/null 2>&1; echo "netns: job still running 80 s after the cut; the logs' tails:"
  for f in "$work"/*.log; do echo "== $(basename "$f")"; tail -n 20 "$f"; done
  kill -9 "$w0" "$w1" "$coordinator" 2>/dev/null ) &
watchdog=$!
status=0
wait "$w0" || status=1
wait "$w1" || status=1
wait "$coordinator" || { echo "the coordinator exited $?"; status=1; }
pkill -P "$watchdog" 2>/dev/null || true  # its sleep
kill "$watchdog" 2>/dev/null || true
cat "$work/coord.log"
[ "$status" -eq 0 ] || { echo "a member failed"; cat "$work"/w*.log; exit 1; }
# How soon after the cut the coordinator declared the server dead is printed above, not
# checked: measured from here it adds this script's polling and the machine's load to the
# failure timeout (a bound on it would fail on a loaded machine with nothing wrong). That the silence, not
# an error of the socket, was detected, is what the 20 s wait for "went down" checks: a cut
# link resets nothing.
grep -q "chain closed over it" "$work/coord.log" || { echo "no failover"; exit 1; }
# Exactly the fault-free result: 150 clocks of (1 + 2) on every key of both shards.
for w in 0 1; do
  line=$(grep "^{\"worker\":$w," "$work/coord.log") || { echo "no result of worker $w in coord.log"; exit 1; }
  echo "$line" | grep -q '"shard_values":{"0":450,"1":450}' || { echo "wrong result: $line"; exit 1; }
  echo "$line" | grep -q '"stale_reads":0' || { echo "stale reads: $line"; exit 1; }
done
echo "netns: PASS (recovered, exact result)"
