#!/usr/bin/env bash
# Reproduces a known defect (docs/clusters.md, "What is not here yet"): a shard cannot leave
# a job whose coordinator was resumed. A clocksum job (3 servers, 2 workers, psnode roles
# on loopback) with --state-dir; the coordinator killed with SIGKILL once the workers run,
# started again with --resume; then psctl remove-shard 1, given 30 s. Prints the psctl
# line, or that it did not answer. Usage: tools/resume_then_remove.sh [BIN_DIR]
set -u
bin=${1:-build/bin}
work=$(mktemp -d)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
coordinator() {
  "$bin/psnode" --role=coordinator --app=clocksum --clocks=400 --clock-ms=40 --servers=3 --workers=2 --port="$port" \
    --host=127.0.0.1 --state-dir="$work" "$@" >>"$work/coordinator.out" 2>>"$work/coordinator.err" &
  coord=$!
}
coordinator
for s in 0 1 2; do "$bin/psnode" --role=server --coordinator=127.0.0.1:"$port" --host=127.0.0.1 >/dev/null 2>&1 & done
for w in 0 1; do "$bin/psnode" --role=worker --app=clocksum --coordinator=127.0.0.1:"$port" --host=127.0.0.1 >/dev/null 2>&1 & done
timeout 30 grep -q -m1 "\[worker 1\] clock" <(tail -n +1 -f "$work/coordinator.err") || { echo "the job never ran"; exit 1; }
kill -9 "$coord"
wait "$coord" 2>/dev/null
coordinator --resume
timeout 30 grep -q -m1 "coordinator: resumed the job" <(tail -n +1 -f "$work/coordinator.err") || { echo "no resume"; exit 1; }
if out=$(timeout 30 "$bin/psctl" --coordinator=127.0.0.1:"$port" remove-shard 1); then
  echo "$out"
else
  echo "psctl remove-shard 1 did not answer within 30 s after the coordinator's resume (the defect)"
fi
