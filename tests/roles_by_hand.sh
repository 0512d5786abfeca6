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
#   start_members PREFIX SERVERS WORKERS PROGRAM  starts that many PROGRAM --role=server and
#       --role=worker --app=clocksum with $join in the background (their pids in $pids),
#       output in $work/PREFIXserverI.out and .err, PREFIXworkerI.out and .err
#   stop_member LOG WHO  SIGTERMs the member whose registration line in LOG names WHO
#       ("server shard 1", "worker 1") and waits for it: sets victim, code and took_ms
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

start_members() {
  local prefix=$1 servers=$2 workers=$3 program=$4 i
  for ((i = 0; i < servers; i++)); do
    "$program" --role=server "${join[@]}" >"$work/${prefix}server$i.out" 2>"$work/${prefix}server$i.err" &
    pids+=($!)
  done
  for ((i = 0; i < workers; i++)); do
    "$program" --role=worker --app=clocksum "${join[@]}" >"$work/${prefix}worker$i.out" 2>"$work/${prefix}worker$i.err" &
    pids+=($!)
  done
}

stop_member() {
  local log=$1 who=$2 start
  victim=$(sed -n "s/.*$who (.*, pid \([0-9]*\)) registered.*/\1/p" "$log" | head -1)
  [ -n "$victim" ] || { cat "$log"; echo "no pid for $who"; exit 1; }
  start=$(date +%s%N)
  kill -TERM "$victim"
  code=0
  wait "$victim" || code=$?  # one of this script's members (ctest's timeout bounds it)
  took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
}
