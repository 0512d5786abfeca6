#!/usr/bin/env bash
# Slurm launches a whole job from one command: a one-node Slurm from Debian's packages
# (munged, slurmctld, slurmd with proctrack/linuxproc and task/none; its keys, sockets, state
# and free ports in a scratch directory) runs the README's sbatch script
# (deploy/slurm/actorps.sbatch) on 5 ranks; every rank's JSON line and the job's accuracy are
# checked. Then the same script on 4 ranks is refused, naming the mismatch.
# usage: slurm_layout.sh BIN_DIR    (77, skipped, unless root with slurm-wlm and munge)
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../deploy/slurm/actorps.sbatch"
[ "$(id -u)" -eq 0 ] || { echo "skipped: the test runs Slurm's daemons as root"; exit 77; }
for p in munged mungekey slurmctld slurmd sbatch; do
  command -v "$p" >/dev/null || { echo "skipped: no $p (Debian's slurm-wlm and munge)"; exit 77; }
done
work=$(mktemp -d)
stop_daemons() {
  local f pid
  for f in slurmd slurmctld munged; do
    [ -f "$work/$f.pid" ] || continue
    pid=$(cat "$work/$f.pid")
    kill "$pid" 2>/dev/null || continue
    timeout 10 tail --pid="$pid" -f /dev/null || true  # ended before its directory goes
  done
  rm -rf "$work" || true
}
trap stop_daemons EXIT
# Three distinct free ports at once (slurmctld, slurmd, the job's coordinator): held open
# together, so the kernel cannot hand the same one out twice.
read -r ctld_port slurmd_port port < <(/usr/bin/python3 -c '
import socket
held = [socket.socket() for _ in range(3)]
for s in held: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in held])')

mkdir -p "$work/state" "$work/spool"
mungekey --create --keyfile="$work/munge.key"
chmod 400 "$work/munge.key"
munged --key-file="$work/munge.key" --socket="$work/munge.sock" --pid-file="$work/munged.pid" \
  --log-file="$work/munged.log" --seed-file="$work/munged.seed" --force
# The node is "localhost" (slurmd -N): its name resolves wherever the test runs, and the
# coordinator's address is the job's first host.
cat >"$work/slurm.conf" <<CONF
ClusterName=actorps
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ps Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
show_logs() { tail -n 20 "$work"/slurm*.log "$work"/job-*.out 2>/dev/null || true; }

# sbatch --wait holds until the job ends (a job waits in the queue until slurmd is up).
cd "$work"
PSNODE="$bin/psnode" timeout 300 sbatch --wait --output="$work/job-%j.out" "$script" --epochs=1 --port="$port" \
  >"$work/sbatch.out" || { show_logs; echo "the sbatch job failed"; exit 1; }
/usr/bin/python3 "$here/check_layout_ranks.py" "$work"/job-*.out 2 2 0.70 || { show_logs; exit 1; }
rm -f "$work"/job-*.out

# Four ranks for a layout of five: every rank refuses, naming both counts.
if PSNODE="$bin/psnode" timeout 120 sbatch --wait --ntasks=4 --output="$work/job-%j.out" "$script" --epochs=1 \
     --port="$port" >"$work/sbatch.out" 2>&1; then
  show_logs; echo "a job of 4 ranks for a layout of 5 ran"; exit 1
fi
grep -F "rank 0: --layout=servers:2,workers:2 needs 5 ranks (1 coordinator, 2 servers, 2 workers), but slurm started 4" \
  "$work"/job-*.out || { show_logs; echo "the mismatch was not named"; exit 1; }
echo "slurm: 5 ranks ran the job; 4 ranks were refused by name"
