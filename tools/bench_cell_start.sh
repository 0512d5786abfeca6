# Sourced by the tools that act on a bench_kv cell while it runs (bench_handoffs.sh,
# bench_pinned.sh): start_cell OUT ARG... starts BENCH_KV with 1 server x 1 worker and
# ARG..., its rows in OUT/rows.json and its stderr in OUT/stderr, sets cell_pid, and
# returns once both processes registered (or exits, showing why bench_kv ended first).
start_cell() {
  local out=$1
  shift
  "$bench" --servers=1 --workers=1 "$@" > "$out/rows.json" 2> "$out/stderr" &
  cell_pid=$!
  for _ in $(seq 1 600); do
    grep -q "registered (1 of 1 servers, 1 of 1 workers)" "$out/stderr" && return 0
    kill -0 $cell_pid 2>/dev/null || { echo "$0: bench_kv ended before its workers registered:" >&2; cat "$out/stderr" >&2; exit 1; }
    sleep 0.1
  done
  echo "$0: bench_kv's processes did not register within 60 s" >&2
  exit 1
}
