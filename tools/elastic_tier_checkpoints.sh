#!/bin/bash
# Reproduces the figures of docs/elasticity.md for map changes under a disk tier: clocksum
# with 40,000 rows on 1 MiB shards and a checkpoint every 3 clocks; a server joins 1.5 s
# in, shard 0 leaves 2.5 s later. Prints the handoff times, the checkpoint rounds
# dropped while the map changed, and for every file written whether all keys and rows
# hold exactly 3 per clock. Run from the build directory: ../tools/elastic_tier_checkpoints.sh [DIR]
set -euo pipefail
dir=${1:-/var/tmp/actorps-elastic-ckpt}
rows=40000
rm -rf "$dir" && mkdir -p "$dir"
bin/psnode --role=local --app=clocksum --servers=2 --workers=2 --clocks=60 --clock-ms=10 --clock-rows=$rows \
  --shard-memory=1048576 --checkpoint-dir="$dir/ckpt" --checkpoint-every=3 > "$dir/job.out" 2>&1 &
job=$!
sleep 1.5
port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$dir/job.out" | head -1 | cut -d: -f2)
bin/psnode --role=server --coordinator=127.0.0.1:$port --shard-memory=1048576 > "$dir/joiner.out" 2>&1 &
sleep 2.5
bin/psctl --coordinator=127.0.0.1:$port remove-shard 0 > "$dir/remove.out"
wait $job
grep -h "handed over in\|dropped" "$dir/job.out" || true
for f in "$dir"/ckpt/checkpoint-*.apsckpt; do
  c=$(basename "$f" .apsckpt | cut -d- -f2)
  one="$dir/one" out="$dir/export"
  rm -rf "$one" "$out" && mkdir -p "$one"
  cp -r "$f" "$dir/ckpt/checkpoint-$c.rows" "$one/"
  if ! bin/psnode --role=export --app=clocksum --clock-rows=$rows --checkpoint-dir="$one" --out="$out" > "$dir/export.log" 2>&1; then
    echo "clock $c: export refused: $(tail -1 "$dir/export.log")"
    continue
  fi
  /usr/bin/python3 - "$out" "$c" "$rows" <<'PY'
import json, sys, numpy
out, clock, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys = numpy.load(out + "/clocksum.npy")
ids = numpy.load(out + "/clockrows.ids.npy")
vals = numpy.load(out + "/clockrows.npy")
want = 3.0 * clock
print(json.dumps({"clock": clock, "keys": int(keys.size), "keys_wrong": int((keys != want).sum()),
                  "rows": int(numpy.unique(ids).size), "rows_wrong": int((vals != want).sum()),
                  "exact": bool(keys.size == 65536 and (keys == want).all() and numpy.unique(ids).size == rows
                                and (vals == want).all())}))
PY
done
