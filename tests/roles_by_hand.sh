# Sourced by the tests that start a job's roles by hand, as across hosts: a scratch
# directory ($work) and the background processes ($pids) cleaned up on exit, and
#   start_coordinator NAME COMMAND...  runs COMMAND (a coordinator with --port=0 and
#       --log-level=info) in the background, its output in $work/NAME.out and .err; waits
#       (bounded: 30 s) for the line saying where it listens; sets coord (its pid) and
#       join (the flags that reach it)
#   await_line FILE TEXT PID SECONDS  waits until FILE (a process's output) has a line
#       with TEXT, as tail -f reads it grow; fails when process PID ends or SECONDS pass
#   serve_and_work NAME PROGRAM  starts PROGRAM --role=server and --role=worker with
#       $join, waits for coordinator NAME and checks that a worker reported "right":true
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

await_line() {
  local file=$1 text=$2 pid=$3 seconds=$4
  timeout "$seconds" grep -q -m1 -F -- "$text" < <(tail -n +1 -f --pid="$pid" "$file")
}

start_coordinator() {
  local name=$1
  shift
  : >"$work/$name.err"  # there before tail reads it (the background job opens it later)
  "$@" >"$work/$name.out" 2>>"$work/$name.err" &
  coord=$!
  pids+=("$coord")
  await_line "$work/$name.err" "coordinator listening on" "$coord" 30 ||
    { cat "$work/$name.err"; echo "the coordinator never said where it listens"; exit 1; }
  local port
  port=$(sed -n 's/.*coordinator listening on [^:]*:\([0-9]*\),.*/\1/p' "$work/$name.err" | head -1)
  join=(--host=127.0.0.1 --coordinator=127.0.0.1:"$port" --ps.register-timeout-ms=20000)
}

serve_and_work() {
  local name=$1 program=$2
  "$program" --role=server "${join[@]}" >"$work/$name.server.out" 2>"$work/$name.server.err" &
  pids+=($!)
  "$program" --role=worker "${join[@]}" >"$work/$name.worker.out" 2>"$work/$name.worker.err" ||
    { cat "$work/$name.worker.err"; echo "the worker failed"; exit 1; }
  wait "$coord" || { cat "$work/$name.err"; echo "the coordinator failed"; exit 1; }
  grep -q '"right":true' "$work/$name.out" || { cat "$work/$name.out"; echo "no right result reported"; exit 1; }
}
