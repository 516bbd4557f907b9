#!/usr/bin/env bash
# The third 2026-11-28 lease (one H200): what the second lease left unmeasured, most wanted first.
# Issue 40: the audit of the 8B-shaped model (random bf16 weights built here), where the kernels change
# with the batch; issue 44: replay 1,000 x 512, where vLLM's load goes, the scored workload against the
# bare engines. Started by bench/gpu_go.sh (results in /tmp/res, steps.txt with times and exit codes;
# `touch /tmp/res/stop` skips the steps not started yet). Needs device-env.sh sourced.
#   STEPS="build-8b audit-8b replay-1000 vllm-load workload"
#   BUDGET_S=1000   no step starts after this many seconds of the chain
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step, want (bench/gpu_steps.sh; cd to the project root)
STEPS=${STEPS:-"build-8b audit-8b replay-1000 vllm-load workload"}
BUDGET_S=${BUDGET_S:-1000}
T0=$(date +%s)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; free -g; } > $R/env.txt 2>&1
MODEL="$PARITY_DEMO_MODEL"
# 40: Llama-3-8B's shape, random bf16 weights (bench/weights.py builds A and B; the audit needs A)
want build-8b && step build-8b 300 python3 bench/weights.py --models 8b --work /tmp/wb --build-only --out $R/build-8b
# 40: the 8B-shaped audit on vLLM's defaults with the prefix cache on, every axis
want audit-8b && [ -f /tmp/wb/llama8b-32l-A/config.json ] && step audit-8b 540 python3 bench/audit.py \
  --setup vllm-8b --model /tmp/wb/llama8b-32l-A --prompts 24 --tokens 256 --no-bare --out $R/audit-8b
# 44: replay 1,000 x 512 (issue 29's size) against bare batched HF and bare vLLM
want replay-1000 && step replay-1000 540 python3 bench/replay.py --rows 1000 --tokens 512 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-1000 --out $R/replay-1000.json
# 44: where vLLM's load goes (its own log lines), cold and warm and in variants
want vllm-load && step vllm-load 420 python3 bench/vllm_load.py --model "$MODEL" --dtype bfloat16 \
  --variants cold,warm,other-batch,default-capture,v1-runner --out $R/vllm_load.json
# 44: the scored workload against bare engines (bare HF batched), 256 prompts x 128 tokens
want workload && step workload 540 python3 bench/workload.py --mode scored --prompts 256 --tokens 128 \
  --model "$MODEL" --work /tmp/pb-workload --out $R/workload-scored.json
log done; touch $R/done
