#!/usr/bin/env bash
# An app's own binary has every role (runtime/app_main.hpp): its --help shows the common
# flags and its own only, it refuses another app, and a job of it runs from roles started
# by hand (coordinator, server, worker), as across hosts. Usage: app_binary.sh BIN_DIR APP
# (an example whose workers report "right":true).
set -euo pipefail
name=$2
app=$1/$name
source "$(dirname "$0")/roles_by_hand.sh"

help=$("$app" --help)
grep -q "^$name: " <<<"$help" || { echo "--help does not name the app"; exit 1; }
for foreign in "--model=" "--data=" "--app=" "--target-accuracy="; do
  if grep -q -- "$foreign" <<<"$help"; then echo "--help lists $foreign, which belongs to other apps"; exit 1; fi
done
grep -q -- "--role=" <<<"$help" && grep -q -- "--ps.transport=" <<<"$help" || { echo "--help lacks the common flags"; exit 1; }

if "$app" --app=fmnist 2>"$work/err"; then echo "--app=fmnist was accepted"; exit 1; fi
grep -q "this binary runs the app $name, not --app=fmnist" "$work/err" || { cat "$work/err"; exit 1; }

# Roles by hand: the coordinator says where it listens, then a server and a worker join it.
start_coordinator coord "$app" --role=coordinator --host=127.0.0.1 --port=0 --servers=1 --workers=1 --log-level=info
serve_and_work coord "$app"
echo "$name: --help, --app and roles by hand: PASS"
