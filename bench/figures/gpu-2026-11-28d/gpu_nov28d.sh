#!/usr/bin/env bash
# The fourth 2026-11-28 lease (one H200): the replay 1,000 x 512 again, now that the rollout side reads
# vLLM's flat logprobs into columns (engines/prompt_logprobs.py; 0.9x bare on the CPU), and the
# trainer's breakdown by chunk size (16, the default, against 64 and 256 rows a forward). Started by
# bench/gpu_go.sh (results in /tmp/res, steps.txt). Needs device-env.sh sourced.
#   STEPS="replay-1000 breakdown"   BUDGET_S=900
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step, want (bench/gpu_steps.sh; cd to the project root)
STEPS=${STEPS:-"replay-1000 breakdown"}
BUDGET_S=${BUDGET_S:-900}
T0=$(date +%s)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; free -g; } > $R/env.txt 2>&1
MODEL="$PARITY_DEMO_MODEL"
want replay-1000 && step replay-1000 540 python3 bench/replay.py --rows 1000 --tokens 512 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-1000 --out $R/replay-1000.json
want breakdown && step breakdown 420 python3 bench/replay.py --rows 1000 --tokens 512 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-1000 --breakdown --breakdown-chunks 16,64,256 --out $R/breakdown.json
log done; touch $R/done
