#!/usr/bin/env bash
# One mpirun line runs a whole job (the README's): Open MPI starts psnode on 5 ranks with
# --layout; rank 0 writes its address to a rendezvous file the others wait for (MPI names no
# host for rank 0). Every rank's JSON line and the job's accuracy are checked.
# usage: mpi_layout.sh BIN_DIR    (77, skipped, without Debian's openmpi-bin)
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null || { echo "skipped: no mpirun (Debian's openmpi-bin)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
as_root=()
[ "$(id -u)" -ne 0 ] || as_root=(--allow-run-as-root)
timeout 300 mpirun "${as_root[@]}" --oversubscribe -n 5 "$bin/psnode" --app=fmnist --layout=servers:2,workers:2 \
  --rendezvous="$work/coordinator.addr" --epochs=1 >"$work/job.out" 2>"$work/job.err" ||
  { tail -n 30 "$work/job.err" "$work/job.out"; echo "the mpirun job failed"; exit 1; }
/usr/bin/python3 "$here/check_layout_ranks.py" "$work/job.out" 2 2 0.70 || { tail -n 30 "$work/job.err"; exit 1; }
grep -q '"coordinator":' "$work/coordinator.addr" || { echo "no rendezvous file"; exit 1; }
echo "mpi: 5 ranks ran the job through the rendezvous file"
