# Sourced by the tools that act on a bench_kv cell while it runs (bench_handoffs.sh,
# bench_pinned.sh, bench_timers.sh): start_cell OUT ARG... starts BENCH_KV with $servers x
# $workers (1 x 1 unless set) and ARG..., its rows in OUT/rows.json and its stderr in
# OUT/stderr, sets cell_pid, and returns once every process registered (or exits, showing
# why bench_kv ended first).
start_cell() {
  local out=$1 s=${servers:-1} w=${workers:-1}
  shift
  "$bench" --servers="$s" --workers="$w" "$@" > "$out/rows.json" 2> "$out/stderr" &
  cell_pid=$!
  for _ in $(seq 1 600); do
    grep -q "registered ($s of $s servers, $w of $w workers)" "$out/stderr" && return 0
    kill -0 $cell_pid 2>/dev/null || { echo "$0: bench_kv ended before its workers registered:" >&2; cat "$out/stderr" >&2; exit 1; }
    sleep 0.1
  done
  echo "$0: bench_kv's processes did not register within 60 s" >&2
  exit 1
}

# start_op_cell PUSH_INTO PULL_INTO BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]: the
# arguments such a tool takes; starts that one cell (5 s each op) in a fresh directory `out`,
# and returns once it has run PUSH_INTO or PULL_INTO seconds into the op's cell (a pull cell
# follows its push cell). Sets bench, size, window, op and transport.
start_op_cell() {
  local push_into=$1 pull_into=$2 into
  shift 2
  [ $# -ge 4 ] || { echo "usage: $0 BENCH_KV SIZE WINDOW push|pull [tcp|shm [FLAG...]]" >&2; exit 2; }
  bench=$1 size=$2 window=$3 op=$4 transport=${5:-tcp}
  shift $(( $# < 5 ? $# : 5 ))  # what is left: flags for bench_kv
  case $op in push) into=$push_into ;; pull) into=$pull_into ;; *) echo "$0: op must be push or pull, not '$op'" >&2; exit 2 ;; esac
  out=$(mktemp -d)
  start_cell "$out" --sizes="[$size]" --windows="[$window]" --transport="$transport" --cell-seconds=5 "$@"
  # The job's first worker measures the limits for 1.25 s before the cells (bench_app).
  sleep "$(echo "$into + 1.25" | bc)"
}
