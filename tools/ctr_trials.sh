#!/bin/bash
# train_ctr AUC trials side by side. Run from a build directory:
#   ../tools/ctr_trials.sh TRIALS_FILE LOG_DIR [PARALLEL=4] [SECONDS=540]
# Each line of TRIALS_FILE is "DATA_DIR train_ctr-flags..." (DATA_DIR as gen_ctr wrote it;
# '#' lines are skipped). Up to PARALLEL trials run at once, each stopped after SECONDS;
# each trial's output goes to LOG_DIR/trial-N.log and one line per trial to stdout: its
# data's bayes_auc, its flags and the test AUC after each epoch it finished.
set -u
trials=$1
logs=$2
parallel=${3:-4}
seconds=${4:-540}
mkdir -p "$logs"

run_trial() {  # N DATA_DIR FLAGS...
  local n=$1 data=$2
  shift 2
  timeout "$seconds" bin/train_ctr --train="$data/train.tsv" --test="$data/test.tsv" "$@" >"$logs/trial-$n.log" 2>&1
}

summary() {  # N DATA_DIR FLAGS...
  local n=$1 data=$2
  shift 2
  local bayes aucs
  bayes=$(grep -o '"bayes_auc":[0-9.]*' "$data/truth.json" | cut -d: -f2)
  aucs=$(grep -o '^epoch [0-9]*/[0-9]*: .*auc [0-9.]*' "$logs/trial-$n.log" | grep -o 'auc [0-9.]*$' | cut -d' ' -f2 |
         paste -sd/)
  echo "trial $n: data $data (bayes_auc ${bayes:-?}) flags: $* -> per-epoch AUC ${aucs:-none}"
}

n=0
while read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  n=$((n + 1))
  # shellcheck disable=SC2086  # the line's flags are words
  run_trial $n $line &
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n; done
done <"$trials"
wait
n=0
while read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  n=$((n + 1))
  # shellcheck disable=SC2086
  summary $n $line
done <"$trials"
