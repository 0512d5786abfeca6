#!/usr/bin/env bash
# A rule an app registered binds the job's members (examples/custom_rule.cpp, FTRL), with
# roles started by hand: a worker given other hyper-parameters is refused naming them, a
# server of a binary without the rule refuses the job naming the rule, and a server and a
# worker given nothing run the job with the coordinator's hyper-parameters. A refusal
# before the job formed ends that job, so each case has a coordinator of its own.
# Usage: rule_contract.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/roles_by_hand.sh"
coordinator() {
  start_coordinator "$1" "$bin/custom_rule" --role=coordinator --host=127.0.0.1 --port=0 --servers=1 --workers=1 \
    --log-level=info --ps.rule-params=l1=4
}

coordinator other
if "$bin/custom_rule" --role=worker "${join[@]}" --ps.rule-params=alpha=0.3,l1=3 2>"$work/other.err" >/dev/null; then
  echo "a worker with other hyper-parameters was accepted"; exit 1
fi
grep -q "ps.rule-params=alpha=0.3,beta=1,l1=3,l2=0.01 (the job has alpha=0.1,beta=1,l1=4,l2=0.01)" "$work/other.err" ||
  { cat "$work/other.err"; echo "the refusal does not name the hyper-parameters"; exit 1; }
kill "$coord" 2>/dev/null || true

coordinator lacking
if "$bin/psnode" --role=server "${join[@]}" 2>"$work/psnode.err" >/dev/null; then
  echo "a server without the rule served the job"; exit 1
fi
grep -q 'unknown update rule "ftrl"' "$work/psnode.err" || { cat "$work/psnode.err"; echo "no word of the rule"; exit 1; }
kill "$coord" 2>/dev/null || true

coordinator right
serve_and_work right "$bin/custom_rule"
grep -q 'l1=4' "$work/right.out" || { cat "$work/right.out"; echo "the worker did not run with the job's l1"; exit 1; }
echo "custom_rule: other hyper-parameters and a binary without the rule refused by name; the job ran: PASS"
