#!/usr/bin/env bash
# An app's own binary has every role (runtime/app_main.hpp): its --help shows the common
# flags and its own only, it refuses another app, and a job of it runs from roles started
# by hand (coordinator, server, worker), as across hosts. Usage: app_binary.sh BIN_DIR APP
# (an example whose workers report "right":true).
set -euo pipefail
name=$2
app=$1/$name
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

help=$("$app" --help)
grep -q "^$name: " <<<"$help" || { echo "--help does not name the app"; exit 1; }
for foreign in "--model=" "--data=" "--app=" "--target-accuracy="; do
  if grep -q -- "$foreign" <<<"$help"; then echo "--help lists $foreign, which belongs to other apps"; exit 1; fi
done
grep -q -- "--role=" <<<"$help" && grep -q -- "--ps.transport=" <<<"$help" || { echo "--help lacks the common flags"; exit 1; }

if "$app" --app=fmnist 2>"$work/err"; then echo "--app=fmnist was accepted"; exit 1; fi
grep -q "this binary runs the app $name, not --app=fmnist" "$work/err" || { cat "$work/err"; exit 1; }

# Roles by hand: the coordinator says where it listens, then a server and a worker join it.
source "$(dirname "$0")/start_coordinator.sh"
start_coordinator coord "$app" --role=coordinator --host=127.0.0.1 --port=0 --servers=1 --workers=1 --log-level=info
"$app" --role=server "${join[@]}" >"$work/server.out" 2>"$work/server.err" &
pids+=($!)
"$app" --role=worker "${join[@]}" >"$work/worker.out" 2>"$work/worker.err" ||
  { cat "$work/worker.err"; echo "the worker failed"; exit 1; }
wait "$coord" || { cat "$work/coord.err"; echo "the coordinator failed"; exit 1; }
grep -q '"right":true' "$work/coord.out" || { cat "$work/coord.out"; echo "no right result reported"; exit 1; }
echo "$name: --help, --app and roles by hand: PASS"
