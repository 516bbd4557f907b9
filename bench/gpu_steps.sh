# Sourced by the GPU chains (bench/gpu_*.sh, bench/figures/*/gpu_*.sh), run by bench/gpu_go.sh on the lent
# machine: results in $R (/tmp/res), one file per step, steps.txt with each step's epoch times and exit
# code; `touch $R/stop` skips the steps not started yet. Runs from the project root. A chain that picks
# its steps sets STEPS (names), BUDGET_S and T0 (its start, epoch s) and asks `want NAME` before each.
R=/tmp/res; mkdir -p $R; cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PARITY_DB=$R/runs.db HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log() { echo "$(date +%s) $*" >> $R/steps.txt; }
step() {  # step NAME TIMEOUT CMD...: one measurement, its output in NAME.out / NAME.err
  local name=$1 t=$2; shift 2
  [ -f $R/stop ] && { log "$name skipped (stop)"; return; }
  log "$name start"; timeout "$t" "$@" > $R/$name.out 2> $R/$name.err; log "$name end rc=$?"
}
want() {  # want NAME: NAME is in $STEPS and the chain is still inside its budget (else logged, skipped)
  [[ " $STEPS " == *" $1 "* ]] || return 1
  (( $(date +%s) - T0 < BUDGET_S )) || { log "$1 skipped (budget)"; return 1; }
}
