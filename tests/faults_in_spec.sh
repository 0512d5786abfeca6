#!/usr/bin/env bash
# The fault plan is the job's (the job spec's "faults"): with roles started by hand,
# --faults given to the coordinator alone kills the shard it names (its server was given
# no plan), the job goes on over the chain's other copy with nothing lost; a member given
# another plan is refused naming both. Usage: faults_in_spec.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/roles_by_hand.sh"
job=(--role=coordinator --app=clocksum --clocks=12 --host=127.0.0.1 --port=0 --servers=2 --workers=1 --replication=2
     --log-level=info --faults="kill server=1 at=4")

start_coordinator other "$bin/psnode" "${job[@]}"
if "$bin/psnode" --role=worker --app=clocksum "${join[@]}" --faults="kill server=0 at=4" 2>"$work/other.err" >/dev/null; then
  echo "a worker given another fault plan was accepted"; exit 1
fi
grep -q -- "--faults=kill server=0 at=4 (the job has kill server=1 at=4)" "$work/other.err" ||
  { cat "$work/other.err"; echo "the refusal does not name both plans"; exit 1; }
kill "$coord" 2>/dev/null || true

start_coordinator kill "$bin/psnode" "${job[@]}"
for s in 0 1; do
  "$bin/psnode" --role=server "${join[@]}" >"$work/server$s.out" 2>"$work/server$s.err" &
  pids+=($!)
done
"$bin/psnode" --role=worker --app=clocksum "${join[@]}" >"$work/worker.out" 2>"$work/worker.err" ||
  { cat "$work/worker.err"; echo "the worker failed"; exit 1; }
wait "$coord" || { cat "$work/kill.err"; echo "the coordinator failed"; exit 1; }
grep -q "fault injector: shard 1 reached clock 4" "$work"/server*.err ||
  { cat "$work"/server*.err; echo "no server followed the coordinator's plan"; exit 1; }
grep -q '"status":"ok"' "$work/kill.out" && grep -q '"updates_lost":\[\]' "$work/kill.out" ||
  { cat "$work/kill.out"; echo "the job did not end ok with nothing lost"; exit 1; }
echo "--faults from the coordinator alone reached the servers; another plan refused by name: PASS"
