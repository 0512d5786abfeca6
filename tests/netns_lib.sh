# Network namespaces as hosts, for the tests that cross a network (sourced).
# netns_hosts NAME...: one namespace per name, each with one address (netns_addr I, in
# the order given) on a bridge in a namespace of its own. Needs root; skip() (exit 77,
# ctest: skipped) where namespaces cannot be made. Removed, with every process started
# by run_in, when the script exits.
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "needs iproute2 (ip)"

tag=ap$(( $$ % 100000 ))          # interface names must stay under 16 characters
work=$(mktemp -d)
netns_names=()
pids=()
netns_cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for n in sw "${netns_names[@]}"; do ip netns del "${tag}_$n" 2>/dev/null || true; done
  rm -rf "$work"
}
trap netns_cleanup EXIT

netns_addr() { echo "192.0.2.$((10 + $1))"; }
netns_hosts() {
  netns_names=("$@")
  ip netns add "${tag}_sw" || skip "cannot create network namespaces here"
  ip -n "${tag}_sw" link add br0 type bridge
  ip -n "${tag}_sw" link set br0 up
  local i ns
  for i in "${!netns_names[@]}"; do
    ns="${tag}_${netns_names[$i]}"
    ip netns add "$ns"
    ip link add "e$i$tag" netns "$ns" type veth peer name "p$i$tag" netns "${tag}_sw"
    ip -n "$ns" addr add "$(netns_addr "$i")/24" dev "e$i$tag"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "e$i$tag" up
    ip -n "${tag}_sw" link set "p$i$tag" master br0
    ip -n "${tag}_sw" link set "p$i$tag" up
  done
}

# run_in NODE LOG PROGRAM ARGS...: PROGRAM in NODE's namespace, output to $work/LOG.
run_in() {
  local node=$1 log=$2; shift 2
  : >"$work/$log"  # exists before anyone waits on it (wait_for's tail would find none)
  ip netns exec "${tag}_$node" "$@" >"$work/$log" 2>&1 &
  pids+=($!)
}
# Blocks until a line matching $2 appears in log $1 (at most $3 s); no polling.
wait_for() { grep -q -m1 "$2" <(timeout "$3" tail -n +1 -f "$1"); }
