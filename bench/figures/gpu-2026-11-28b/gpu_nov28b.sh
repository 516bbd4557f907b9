#!/usr/bin/env bash
# The second 2026-11-28 lease (one H200): what the first lease left unmeasured, most wanted first.
# Issue 41: the 8B-shaped tensor check (goal <= 60 s); issue 40: a certificate for the axes that held on
# the demo (replay, second instance, async scheduling), the HF setup, the 8B-shaped audit; issue 44: a
# newcomer's first run, replay 256 x 256 against batched bare HF, routes on/off, the cold first compare,
# replay 1,000 x 512. Started by bench/gpu_go.sh (results in /tmp/res, steps.txt with times and exit codes;
# `touch /tmp/res/stop` skips the steps not started yet). Needs device-env.sh sourced.
#   STEPS="weights-8b cert first-run replay-256 routes-ab cold-start audit-hf audit-8b replay-1000"
#   BUDGET_S=1380   no step starts after this many seconds of the chain
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
STEPS=${STEPS:-"weights-8b cert first-run replay-256 routes-ab cold-start audit-hf audit-8b replay-1000"}
BUDGET_S=${BUDGET_S:-1380}
T0=$(date +%s)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; free -g; } > $R/env.txt 2>&1
MODEL="$PARITY_DEMO_MODEL"
# 41: Llama-3-8B's shape, random bf16 weights built here; A updated to B in flight, then B with layer 16 left out
want weights-8b && step weights-8b 540 python3 bench/weights.py --models 8b --work /tmp/wb --out $R/weights-8b
# 40: a certificate for the axes that held on the demo in the first lease (vLLM defaults), 128 x 512
want cert && step cert 420 python3 bench/audit.py --setup vllm --axes replay,instance,async --prompts 128 \
  --tokens 512 --no-bare --out $R/cert
# 44: prepare() in a fresh process, the tokenizer not yet verified (goal <= 2 s cold)
want first-run && step first-run 180 python3 bench/first_run.py --repeat 1 --out $R/first_run.json
# 44: replay 256 x 256 against bare batched HF (goal trainer <= 1.2x) and bare vLLM (whole <= 1.5x)
want replay-256 && step replay-256 420 python3 bench/replay.py --rows 256 --tokens 256 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-256 --out $R/replay-256.json
# 44: routes capture on / off in one run, a 64-prompt scored workload of a small MoE (goal <= 1.15x)
if want routes-ab; then
  step build-moe 180 python3 -c "import sys; sys.path.insert(0, 'tests'); from tiny_models import build_moe_model; \
build_moe_model('/tmp/pb-moe-small', 'qwen3_moe', dtype='bfloat16', hidden_size=512, num_hidden_layers=8, num_experts=32, top_k=4, init_range=0.02)"
  step routes-ab 420 python3 bench/workload.py --routes-ab --cold --model /tmp/pb-moe-small --dtype bfloat16 \
    --prompts 64 --tokens 128 --batch 64 --chunk 64 --work /tmp/pb-routes --out $R/routes-ab.json
fi
# 44: the whole first `parity compare`, caches cold, against the bare engines (goal <= 1.05x the slowest)
want cold-start && step cold-start 420 python3 bench/cold_start.py --model "$MODEL" --dtype bfloat16 \
  --max-new-tokens 128 --fresh-tokenizer --no-warm --out $R/cold_start.json
# 40: the HF setup in bf16: batch 1 vs left-padded batches, eager vs sdpa, decode vs prefill
want audit-hf && step audit-hf 360 python3 bench/audit.py --setup hf --prompts 16 --tokens 128 --out $R/audit-hf
# 40: the 8B-shaped model (weights-8b built it), where the kernels change with the batch
want audit-8b && [ -f /tmp/wb/llama8b-32l-A/config.json ] && step audit-8b 540 python3 bench/audit.py \
  --setup vllm-8b --model /tmp/wb/llama8b-32l-A --prompts 24 --tokens 256 --no-bare --out $R/audit-8b
# 44: replay 1,000 x 512
want replay-1000 && step replay-1000 540 python3 bench/replay.py --rows 1000 --tokens 512 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-1000 --out $R/replay-1000.json
log done; touch $R/done
