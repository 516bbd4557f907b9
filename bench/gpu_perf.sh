#!/usr/bin/env bash
# Issue 29's replay speed and issue 33 item 5's scored workload on the GPU machine, before and after the
# perf-scored branch, back to back on one machine. Started by bench/gpu_go.sh (results in /tmp/res, one
# file per step, steps.txt with their times and exit codes); most important first.
# BASE: a folder holding main's tree (made before the call: `git archive main | tar -x -C perf-base`);
# without it only this tree is measured. `touch /tmp/res/stop` skips the steps not started yet.
R=/tmp/res; mkdir -p $R; HERE="$(cd "$(dirname "$0")/.." && pwd)"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log() { echo "$(date +%s) $*" >> $R/steps.txt; }
step() {  # step NAME TREE TIMEOUT CMD...: one measurement run from TREE
  local name=$1 tree=$2 t=$3; shift 3
  [ -f $R/stop ] && { log "$name skipped (stop)"; return; }
  log "$name start"; (cd "$tree" && PARITY_DB=$R/$name.db timeout "$t" "$@" > $R/$name.out 2> $R/$name.err); log "$name end rc=$?"
}
trees() { [ -n "$BASE" ] && [ -d "$BASE/parity_ui" ] && echo "base:$BASE"; echo "new:$HERE"; }
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print(vllm.__version__, transformers.__version__, torch.__version__)"; } > $R/env.txt 2>&1
# 1. the HF scoring alone against bare teacher-forcing, one process (seconds a leg, logprobs bit-identical)
for t in $(trees); do
  step "hf-score-${t%%:*}" "${t#*:}" 300 env PARITY_TREE="${t#*:}" python3 "$HERE/bench/hf_score.py" --model "$PARITY_DEMO_MODEL" --dtype bfloat16 \
    --rows 200 --tokens 512 --repeat 3 --out $R/hf-score-${t%%:*}.json
done
# 2. issue 29: replay 1,000 rows x 512 tokens, the trainer side against bare HF teacher-forcing
for t in $(trees); do
  step "replay-${t%%:*}" "${t#*:}" 600 python3 bench/replay.py --rows 1000 --tokens 512 --model "$PARITY_DEMO_MODEL" \
    --dtype bfloat16 --work /tmp/pb-replay-${t%%:*} --out $R/replay-speed-${t%%:*}.json
done
# 3. issue 33 item 5: the scored 1,000-prompt workload against the bare engines (whole and work ratios)
for t in $(trees); do
  step "workload-scored-${t%%:*}" "${t#*:}" 600 python3 bench/workload.py --mode scored --prompts 1000 --tokens 128 \
    --work /tmp/pb-workload-${t%%:*} --out $R/workload-scored-${t%%:*}.json
done
# 4. the same, this tree with the reference's scoring in one call (no overlap with the parent's work): what the overlap gives
step "workload-scored-one-piece" "$HERE" 600 env PARITY_BENCH_ONE_PIECE=1 python3 bench/workload.py --mode scored \
  --prompts 1000 --tokens 128 --work /tmp/pb-workload-one --out $R/workload-scored-one-piece.json
log done; touch $R/done
