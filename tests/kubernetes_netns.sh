#!/usr/bin/env bash
# Kubernetes' part played in network namespaces, with the commands of
# deploy/kubernetes/actorps.yaml (tests/kubernetes_commands.py reads and checks them): every
# member is addressed by its pod's DNS name (POD.actorps), from a hosts file per namespace
# (ip netns exec mounts /etc/netns/NS/hosts over /etc/hosts; rewritten in place, a moved
# name is seen by every process). A clocksum job of 3 servers and 2 workers under BSP runs
# (40 ms of "compute" a clock, 400 clocks: 16 s at least), its members' pods started before
# the coordinator's (they wait for it); the probes answer; the pod serving shard 1 is
# replaced: SIGTERM (it drains, exit 0), its name moves to another host, a new process
# under the same name joins. Then the coordinator's pod is rescheduled: SIGTERM (it steps
# down, exit 143), its name moves, the manifest's command starts it there and it resumes
# from the same state directory (the pod's volume). Then the pod serving shard 2 gets
# SIGTERM and drains under the resumed coordinator (its shard's peers were reached through
# the first coordinator's node: it dials them). The workers hold at clock 390 until the
# map holds shards 0 and 3; a worker done while the coordinator is away waits for it.
# The job must end ok with exact sums and no lost update. Needs root (exit 77 otherwise, as
# without python3-yaml). Usage: kubernetes_netns.sh BIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
manifest="$here/../deploy/kubernetes/actorps.yaml"
/usr/bin/python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: needs python3-yaml"; exit 77; }
source "$here/netns_lib.sh"
netns_hosts coord0 server0 server1 server2 worker0 worker1 server1b coord1  # a pod each
trap 'rm -rf /etc/netns/${tag}_*; netns_cleanup' EXIT
declare -A host_of=([actorps-coordinator-0]=0 [actorps-server-0]=1 [actorps-server-1]=2 [actorps-server-2]=3)
write_hosts() {
  local lines="127.0.0.1 localhost"$'\n' name ns
  for name in "${!host_of[@]}"; do lines+="$(netns_addr "${host_of[$name]}") $name.actorps"$'\n'; done
  for ns in "${netns_names[@]}"; do
    mkdir -p "/etc/netns/${tag}_$ns"
    printf '%s' "$lines" >"/etc/netns/${tag}_$ns/hosts"  # in place: the mounted file's inode stays
  done
}
# ROLE POD [FROM=>TO...]: the manifest's command for that pod, its paths here (each pod
# its own shard directory: the StatefulSet's volume).
pod_command() {
  local role=$1 pod=$2
  shift 2
  mkdir -p "$work/shard-$pod"
  /usr/bin/python3 "$here/kubernetes_commands.py" "$manifest" "$role" "$pod" /opt/actorps/bin=">$bin" \
    /var/lib/actorps-shard=">$work/shard-$pod" /var/lib/actorps=">$work/state" /etc/actorps/secret=">$work/secret" \
    "--clocks=100000=>--clocks=400 --clock-ms=40 --hold-at-clock=390 --hold-for-shards=[0,3]" "$@"
}
start_pod() {  # NAMESPACE ROLE POD: the pod's process; its pid in $pod
  run_in "$1" "$3.log" bash -c "exec $(pod_command "$2" "$3")"
  pod=$!
}
ready() { ip netns exec "${tag}_$1" curl -sf "http://127.0.0.1:8080/$2" >/dev/null; }

write_hosts
head -c 32 /dev/urandom >"$work/secret"
chmod 400 "$work/secret"
mkdir -p "$work/state" "$work/shard-new"
pod_command coordinator x >/dev/null  # the manifest's checks, before anything starts
# The members' pods start first, as Kubernetes may start them: they wait for the coordinator
# (the manifests give --ps.failure-timeout-ms).
servers=()
for i in 0 1 2; do
  start_pod "server$i" server "actorps-server-$i"
  servers+=("$pod")
done
workers=()
for w in 0 1; do
  start_pod "worker$w" worker "worker-$w"
  workers+=("$pod")
done
start_pod coord0 coordinator actorps-coordinator-0
coord=$pod
wait_for "$work/actorps-coordinator-0.log" "coordinator listening" 20 || { cat "$work"/*.log; exit 1; }
log="$work/actorps-coordinator-0.log"
wait_for "$log" "\[worker 1\] clock" 60 || { tail -n 20 "$work"/*.log; echo "the job never ran"; exit 1; }
ready coord0 readyz && ready server0 readyz && ready server0 healthz || { echo "a probe failed"; exit 1; }

# SHARD: the pod serving it (pods register in any order) gets SIGTERM and drains, exit 0;
# its pod's index in $k.
drain_pod_of() {
  k=$(sed -n "s/.*server shard $1 (actorps-server-\([0-9]\)\.actorps.*/\1/p" "$work"/*coordinator*.log | head -1)
  [ -n "$k" ] || { cat "$log"; echo "no pod named for shard $1"; exit 1; }
  kill -TERM "${servers[$k]}"
  local code=0
  wait "${servers[$k]}" || code=$?
  [ "$code" -eq 0 ] && grep -q '"drained"' "$work/actorps-server-$k.log" ||
    { tail -n 20 "$work"/*.log; echo "actorps-server-$k did not drain ($code)"; exit 1; }
  grep '"drained"' "$work/actorps-server-$k.log"  # the handoff's time, for the record
  servers[$k]=""  # waited for
}

# The pod serving shard 1 is replaced: it drains; a new process under its name joins from
# elsewhere, as shard 3.
drain_pod_of 1
mv "$work/actorps-server-$k.log" "$work/server-$k-first.log"
host_of[actorps-server-$k]=6
write_hosts
run_in server1b "actorps-server-$k.log" bash -c "exec $(pod_command server "actorps-server-$k" "$work/shard-actorps-server-$k=>$work/shard-new")"
servers[$k]=$!
wait_for "$log" "joined; its keys and rows were handed over" 60 || { tail -n 20 "$work"/*.log; echo "no join"; exit 1; }

# The coordinator's pod is rescheduled: it steps down; the next one resumes from the volume.
kill -TERM "$coord"
code=0
wait "$coord" || code=$?
[ "$code" -eq 143 ] && grep -q '"status":"stepped_down"' "$log" || { cat "$log"; echo "no step-down ($code)"; exit 1; }
mv "$log" "$work/coordinator-first.log"
host_of[actorps-coordinator-0]=7
write_hosts
start_pod coord1 coordinator actorps-coordinator-0
coord=$pod
wait_for "$log" "coordinator: resumed the job" 60 || { tail -n 20 "$work"/*.log; echo "no resume"; exit 1; }
# A server leaves the resumed job.
drain_pod_of 2

code=0
wait "$coord" || code=$?
[ "$code" -eq 0 ] || { tail -n 30 "$log"; echo "the resumed coordinator exited $code"; exit 1; }
for p in "${workers[@]}" "${servers[@]}"; do
  [ -n "$p" ] || continue  # drained, waited for
  code=0
  wait "$p" || code=$?
  [ "$code" -eq 0 ] || { tail -n 20 "$work"/*.log; echo "member $p exited $code"; exit 1; }
done
tail -n 1 "$log"
grep -q '"updates_lost":\[\]' "$log" || { echo "updates were lost"; exit 1; }
results=$(grep '"shard_values"' "$log")
[ "$(wc -l <<<"$results")" -eq 2 ] || { cat "$log"; echo "not two worker results"; exit 1; }
grep -q '"shard_values":{"0":1200,"3":1200}' <<<"$results" || { echo "$results"; echo "sums not exact"; exit 1; }
echo "kubernetes_netns: a server replaced under its name, the coordinator rescheduled and resumed, another server drained after the resume; exact sums: PASS"
