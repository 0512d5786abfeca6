# Sourced by the roles-by-hand tests: start_coordinator NAME COMMAND... runs COMMAND (a
# coordinator with --port=0 --log-level=info) in the background with its output in
# $work/NAME.out and .err, waits (bounded: 30 s) for the line saying where it listens,
# and sets coord (its pid, also added to pids) and join (the flags that reach it).
start_coordinator() {
  local name=$1
  shift
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  coord=$!
  pids+=("$coord")
  local port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's/.*coordinator listening on [^:]*:\([0-9]*\),.*/\1/p' "$work/$name.err" | head -1)
    [ -n "$port" ] && break
    kill -0 "$coord" 2>/dev/null || { cat "$work/$name.err"; echo "the coordinator ended before it listened"; exit 1; }
    sleep 0.1  # waits for the coordinator's line
  done
  [ -n "$port" ] || { echo "the coordinator never said where it listens"; exit 1; }
  join=(--host=127.0.0.1 --coordinator=127.0.0.1:"$port" --ps.register-timeout-ms=20000)
}
