#!/bin/bash
# Once a second, what a block device did: reads/s, the mean read's time in ms
# (Δ ms reading ÷ Δ reads), the mean reads in flight (Δ time_in_queue ÷ 1,000 ms) and
# writes/s, from /sys/block/DEV/stat (the kernel's Documentation/block/stat.rst). How
# BENCHMARKS.md ("Reads in units") saw the shard leave most of its readers idle.
# Usage: tools/diskstat.sh [DEV] (default: the device under /var/tmp); stop with Ctrl-C.
set -euo pipefail
source_dev=$(df --output=source /var/tmp | tail -1)
dev=${1:-$(lsblk -no pkname "$source_dev" 2>/dev/null || true)}  # a partition's disk
dev=${dev:-$(basename "$source_dev")}                               # or the disk itself
stat=/sys/block/$dev/stat
[ -r "$stat" ] || { echo "diskstat: no $stat (give the device, e.g. vda or nvme0n1)" >&2; exit 2; }
read -r -a prev < "$stat"
while sleep 1; do
  read -r -a cur < "$stat"
  reads=$((cur[0] - prev[0])) read_ms=$((cur[3] - prev[3])) writes=$((cur[4] - prev[4])) queue_ms=$((cur[10] - prev[10]))
  awk -v t="$(date +%T)" -v r=$reads -v ms=$read_ms -v w=$writes -v q=$queue_ms \
    'BEGIN { printf "%s reads/s=%d read_ms=%.3f in_flight=%.1f writes/s=%d\n", t, r, r ? ms / r : 0, q / 1000, w }'
  prev=("${cur[@]}")
done
