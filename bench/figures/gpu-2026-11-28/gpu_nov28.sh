#!/usr/bin/env bash
# The 2026-11-28 lease: issues 40 (audit), 41 (weights), 42 (op map), 44 (speed) and 46 item 19 (a TP=2
# replica group on Ray), one chain started by bench/gpu_go.sh on the lent 2-GPU machine (results in
# /tmp/res: one .json/.out/.err per step, steps.txt with each step's times and exit code). The session has
# 30 minutes of device time for the install and every figure, so the most wanted figures come first and
# the sizes are cut to fit; a step that would start after BUDGET_S is named "skipped (budget)".
#   STEPS="weights opmap audit-bi tp2 audit replay-256 routes-ab"   which steps, in order
#   BUDGET_S=1260   no step starts after this many seconds of the chain (the calls after the install)
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
STEPS=${STEPS:-"weights opmap audit-bi tp2 audit replay-256 routes-ab"}
BUDGET_S=${BUDGET_S:-1260}
T0=$(date +%s)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; free -g; } > $R/env.txt 2>&1
MODEL="$PARITY_DEMO_MODEL"
# 41: an engine updated in flight (load_weights through collective_rpc) checked tensor by tensor against a
# fresh load, a stale layer named, the probe against the floor, sleep levels 1 and 2; the bare digest
want weights && step weights 420 python3 bench/weights.py --models demo --work /tmp/wb --out $R/weights
# 42: the op map of the demo in bf16, 30 layers x 256 positions (goal <= 60 s warm), the swap, bare prefills
want opmap && step opmap 360 python3 bench/opmap.py --out $R/opmap
# 40: the audit with VLLM_BATCH_INVARIANT=1 (the setup that should certify zero), every axis, 128 x 512 (the
# SGLang protocol's size; goal: the whole audit <= 10 min)
want audit-bi && step audit-bi 660 python3 bench/audit.py --setup vllm-bi --prompts 128 --tokens 512 --no-bare \
  --out $R/audit-bi
# 46.19: a TP=2 replica group on Ray (2 GPUs) against TP=1 (bench/cluster_tp2.py; a model TP=2 can split)
want tp2 && [ -f bench/cluster_tp2.py ] && step tp2 540 python3 bench/cluster_tp2.py --runs tp1,tp2 --out $R/tp2
# 40: the default vLLM setup (CUDA graphs, prefix caching on), every axis, 64 x 512: which axes break
want audit && step audit 480 python3 bench/audit.py --setup vllm --prompts 64 --tokens 512 --no-bare --out $R/audit
# 44: replay 256 x 256 against bare batched HF and bare vLLM
want replay-256 && step replay-256 420 python3 bench/replay.py --rows 256 --tokens 256 --model "$MODEL" \
  --dtype bfloat16 --work /tmp/pb-replay-256 --out $R/replay-256.json
# 44: routes capture on / off, a 64-prompt scored workload of a small MoE built here
if want routes-ab; then
  step build-moe 180 python3 -c "import sys; sys.path.insert(0, 'tests'); from tiny_models import build_moe_model; \
build_moe_model('/tmp/pb-moe-small', 'qwen3_moe', dtype='bfloat16', hidden_size=512, num_hidden_layers=8, num_experts=32, top_k=4, init_range=0.02)"
  step routes-ab 420 python3 bench/workload.py --routes-ab --cold --model /tmp/pb-moe-small --dtype bfloat16 \
    --prompts 64 --tokens 128 --batch 64 --chunk 64 --work /tmp/pb-routes --out $R/routes-ab.json
fi
log done; touch $R/done
