#!/usr/bin/env bash
# The rest of gpu_wings.sh on a 2-GPU machine, in parallel where the GPUs allow: sampling and the replay
# on GPU 1 while gpu_wings.sh's MoE step holds GPU 0; then the 2-replica cluster run over both GPUs.
# Writes into the same /tmp/res; touch /tmp/res/stop first so gpu_wings.sh stops after its current step.
R=/tmp/res; cd "$(dirname "$0")/../../.."  # the project root
export PARITY_DB=$R/runs2.db HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log() { echo "$(date +%s) $*" >> $R/steps.txt; }
step() { local name=$1 t=$2; shift 2; log "$name start"; timeout "$t" "$@" > $R/$name.out 2> $R/$name.err; log "$name end rc=$?"; }
(
  export CUDA_VISIBLE_DEVICES=1
  step sampling 300 python3 bench/sampling.py --model "$PARITY_DEMO_MODEL" --prompts 256 --tokens 128 --batch 64 --dtype bfloat16 --out $R/sampling.json
  step replay 420 python3 bench/replay.py --rows 1000 --tokens 512 --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --work /tmp/pb-replay --out $R/replay-speed.json
) &
G1=$!
while ! grep -q "moe-a3b end" $R/steps.txt; do sleep 3; done
wait $G1
step cluster-scored 600 python3 bench/cluster.py --modes scored --prompts 1000 --no-in-process --out $R
log done2; touch $R/done2 $R/done
