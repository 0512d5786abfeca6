#!/usr/bin/env bash
# Several machines: a coordinator, two servers and two workers on three hosts (network
# namespaces on a bridge), each member given only --coordinator=HOST:PORT. Every process
# listens on all interfaces and members announce the address of their route to the
# coordinator (--advertise's default), so workers reach the servers on another host.
# Checks the job trains Fashion-MNIST to the usual accuracy and every process exits 0.
# Needs root (as CI has); exits 77 (ctest: skipped) without it.
set -euo pipefail
bin=$(cd "$1" && pwd)
source "$(dirname "$0")/netns_lib.sh"
netns_hosts coord servers workers
coord="$(netns_addr 0):7100"
# Blocks of 4 KiB and more go over the data plane, whose listener is announced the same way.
job=(--app=fmnist --model=softmax --servers=2 --workers=2 --epochs=5 --ps.data-plane-bytes=4096)
run_in coord coord.log "$bin/psnode" --role=coordinator --port=7100 "${job[@]}"
c=$!
wait_for "$work/coord.log" "coordinator listening" 20 || { cat "$work/coord.log"; exit 1; }
grep "coordinator listening" "$work/coord.log"
members=()
for i in 0 1; do
  run_in servers "s$i.log" "$bin/psnode" --role=server --coordinator="$coord" --ps.data-plane-bytes=4096; members+=($!)
  run_in workers "w$i.log" "$bin/psnode" --role=worker --app=fmnist --coordinator="$coord" --ps.data-plane-bytes=4096; members+=($!)
done
status=0
for p in "$c" "${members[@]}"; do
  # A hang is ended by ctest's timeout; the logs then say where each process was.
  wait "$p" || { echo "process $p exited $?"; status=1; }
done
for f in "$work"/*.log; do echo "== $(basename "$f")"; grep -v "^\[worker\|iter " "$f" | tail -n 8; done
[ "$status" -eq 0 ] || exit 1
# The servers announced their own host's address, not loopback or 0.0.0.0.
grep -q "$(netns_addr 1):" "$work/coord.log" || { echo "no server announced $(netns_addr 1)"; exit 1; }
grep -q "worker 1 ($(netns_addr 2), pid" "$work/coord.log" || { echo "no worker announced $(netns_addr 2)"; exit 1; }
# Both workers report; worker 0 evaluates: softmax reaches 0.82 in 5 epochs.
grep -q '"workers_reporting":2,' "$work/coord.log" || { echo "not every worker reported"; exit 1; }
acc=$(grep '^{"worker":0,' "$work/coord.log" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2)
[ -n "$acc" ] || { echo "no accuracy from worker 0"; exit 1; }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.82) }' || { echo "accuracy $acc < 0.82"; exit 1; }
echo "netns_hosts: test_accuracy $acc"
# Blocks crossed hosts on the data plane too (its listener is announced like the node's).
received=$(grep '^{"worker":0,' "$work/coord.log" | grep -o '"data_plane_received":[0-9]*' | cut -d: -f2)
[ "${received:-0}" -gt 0 ] || { echo "no bytes over the data plane"; exit 1; }
echo "netns_hosts: worker 0 received $received bytes over the data plane"
echo "netns_hosts: PASS (three hosts, only the coordinator's address given)"
