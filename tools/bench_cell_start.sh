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
