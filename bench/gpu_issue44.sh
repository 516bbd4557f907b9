#!/usr/bin/env bash
# Issue 44's GPU figures, one chain: a newcomer's first run, the replay and the scored workload against
# batched bare engines, routes on/off, and where vLLM's load goes. Started by bench/gpu_go.sh on the lent
# machine (results in /tmp/res: one .json/.out/.err per step, steps.txt with each step's times and exit
# code). Most important first; the first-run steps come first because they measure a fresh machine.
#   STEPS="first-run cold-start replay-256 routes-ab replay-1000 vllm-load workload"   which steps, in order
#   BUDGET_S=480   no step starts after this many seconds of the chain (each is named "skipped (budget)")
# A later call on the same held machine can run what was skipped: STEPS="replay-1000 vllm-load" BUDGET_S=540
# (with gpu_go.sh: remove /tmp/res/launched and /tmp/res/done first, or it only waits).
source "$(dirname "$0")/gpu_steps.sh"  # R, log, step (and cd to the project root)
STEPS=${STEPS:-"first-run cold-start replay-256 routes-ab replay-1000 vllm-load workload"}
BUDGET_S=${BUDGET_S:-480}
T0=$(date +%s)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; free -g; uptime; } > $R/env.txt 2>&1
MODEL="$PARITY_DEMO_MODEL"
# 1. prepare() in a fresh process, its tokenizer never verified (an empty parity-ui cache) and then verified:
#    goal <= 2 s cold (was 15.2 s: transformers and torch imported to verify the light tokenizer)
want first-run && step first-run 240 python3 bench/first_run.py --repeat 1 --out $R/first_run.json
# 2. the whole first `parity compare` (demo, gravity chat prompt), caches and tokenizer cold, against bare
#    vLLM and bare HF doing the same work (tokens asserted): goal <= 1.05x the slowest bare process
want cold-start && step cold-start 420 python3 bench/cold_start.py --model "$MODEL" --dtype bfloat16 \
  --max-new-tokens 128 --fresh-tokenizer --no-warm --out $R/cold_start.json
# 3. replay 256 x 256: the trainer's batched scoring against bare batched HF (goal <= 1.2x) and the whole
#    replay against bare HF + bare vLLM (one generate call) (goal <= 1.5x); also bare one row a forward
want replay-256 && step replay-256 420 python3 bench/replay.py --rows 256 --tokens 256 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-256 --out $R/replay-256.json
# 4. routes on / off in one run, a 64-prompt scored workload of a small MoE (Qwen3-MoE, 8 layers, 32
#    experts, top-4, bf16, built here): the generate phase's ratio (goal <= 1.15x; was 1.84x)
if want routes-ab; then
  step build-moe 180 python3 -c "import sys; sys.path.insert(0, 'tests'); from tiny_models import build_moe_model; \
build_moe_model('/tmp/pb-moe-small', 'qwen3_moe', dtype='bfloat16', hidden_size=512, num_hidden_layers=8, num_experts=32, top_k=4, init_range=0.02)"
  step routes-ab 420 python3 bench/workload.py --routes-ab --cold --model /tmp/pb-moe-small --dtype bfloat16 \
    --prompts 64 --tokens 128 --batch 64 --chunk 64 --work /tmp/pb-routes --out $R/routes-ab.json
fi
# 5. replay 1,000 x 512 (issue 29's size), as 3.
want replay-1000 && step replay-1000 540 python3 bench/replay.py --rows 1000 --tokens 512 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-1000 --out $R/replay-1000.json
# 6. where vLLM's load goes (its own log lines), cold and warm, with vLLM's default capture sizes, with
#    the V1 runner and no async scheduling (full_distribution's setup), batch 1 (a comparison)
want vllm-load && step vllm-load 420 python3 bench/vllm_load.py --model "$MODEL" --dtype bfloat16 \
  --variants cold,warm,other-batch,default-capture,v1-runner --out $R/vllm_load.json
# 7. the scored workload against bare engines (bare HF batched), 256 prompts x 128 tokens
want workload && step workload 540 python3 bench/workload.py --mode scored --prompts 256 --tokens 128 \
  --model "$MODEL" --work /tmp/pb-workload --out $R/workload-scored.json
log done; touch $R/done
