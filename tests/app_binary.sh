#!/usr/bin/env bash
# An app's own binary has every role (runtime/app_main.hpp): its --help shows the common
# flags and its own only, it refuses another app, and a job of it runs from roles started
# by hand (coordinator, server, worker), as across hosts. Usage: app_binary.sh BIN_DIR
set -euo pipefail
app=$1/hello_kv
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

help=$("$app" --help)
grep -q "^hello_kv: push and pull sums" <<<"$help" || { echo "--help does not name the app"; exit 1; }
for foreign in "--model=" "--data=" "--app=" "--target-accuracy="; do
  if grep -q -- "$foreign" <<<"$help"; then echo "--help lists $foreign, which belongs to other apps"; exit 1; fi
done
grep -q -- "--role=" <<<"$help" && grep -q -- "--ps.transport=" <<<"$help" || { echo "--help lacks the common flags"; exit 1; }

if "$app" --app=fmnist 2>"$work/err"; then echo "--app=fmnist was accepted"; exit 1; fi
grep -q "this binary runs the app hello_kv, not --app=fmnist" "$work/err" || { cat "$work/err"; exit 1; }

# Roles by hand: the coordinator says where it listens, then a server and a worker join it.
"$app" --role=coordinator --host=127.0.0.1 --port=0 --servers=1 --workers=1 --log-level=info \
  >"$work/coord.out" 2>"$work/coord.err" &
coord=$!
pids+=("$coord")
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*coordinator listening on [^:]*:\([0-9]*\),.*/\1/p' "$work/coord.err" | head -1)
  [ -n "$port" ] && break
  kill -0 "$coord" 2>/dev/null || { cat "$work/coord.err"; echo "the coordinator ended before it listened"; exit 1; }
  sleep 0.1  # waits for the coordinator's line, bounded: 30 s
done
[ -n "$port" ] || { echo "the coordinator never said where it listens"; exit 1; }
"$app" --role=server --host=127.0.0.1 --coordinator=127.0.0.1:"$port" >"$work/server.out" 2>"$work/server.err" &
pids+=($!)
"$app" --role=worker --host=127.0.0.1 --coordinator=127.0.0.1:"$port" >"$work/worker.out" 2>"$work/worker.err" ||
  { cat "$work/worker.err"; echo "the worker failed"; exit 1; }
wait "$coord" || { cat "$work/coord.err"; echo "the coordinator failed"; exit 1; }
grep -q '"right":true' "$work/coord.out" || { cat "$work/coord.out"; echo "no right sums reported"; exit 1; }
echo "hello_kv: --help, --app and roles by hand: PASS"
