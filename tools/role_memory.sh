#!/usr/bin/env bash
# The peak resident size of each role of ./run demo's job (Fashion-MNIST softmax, 2 servers,
# 2 workers, 5 epochs), each started by hand under /usr/bin/time -f %M: the README's
# "What each role needs on its host". Usage: tools/role_memory.sh [BIN_DIR]
set -euo pipefail
bin=${1:-build/bin}
source "$(dirname "$0")/../tests/roles_by_hand.sh"
start_coordinator coord /usr/bin/time -f "coordinator peak_rss_kb %M" "$bin/psnode" --role=coordinator --app=fmnist \
  --model=softmax --epochs=5 --host=127.0.0.1 --port=0 --servers=2 --workers=2 --log-level=info
for s in 0 1; do /usr/bin/time -f "server peak_rss_kb %M" "$bin/psnode" --role=server "${join[@]}" >/dev/null 2>"$work/s$s.err" & done
for w in 0 1; do
  /usr/bin/time -f "worker peak_rss_kb %M" "$bin/psnode" --role=worker --app=fmnist "${join[@]}" >/dev/null 2>"$work/w$w.err" &
done
wait
grep -h peak_rss_kb "$work"/*.err
grep -o '"test_accuracy":[0-9.]*' "$work/coord.out"
