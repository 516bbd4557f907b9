#!/usr/bin/env bash
# The GPU checks of issues 29-33 in one background chain on a lent 2-GPU machine (started by
# bench/gpu_go.sh under setsid, so it outlives a 10-minute call): results in /tmp/res, one file per step,
# steps.txt with their times and exit codes. Most important first: a chain cut short keeps what ran.
# `touch /tmp/res/stop` skips the steps not started yet. Needs device-env.sh sourced.
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
mkdir -p $R/free $R/moe-tiny $R/moe-a3b
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch, ray; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"; nproc; } > $R/env.txt 2>&1
# issue 33 item 4: the first use of the demo tokenizer verifies it; then a fresh process's time before workers
python3 -c "from parity_ui.inputs.demo_model import demo_model_dir; from parity_ui.inputs.prompts import tokenizer_for; print(tokenizer_for(str(demo_model_dir())).light)" > $R/tokenizer-verify.out 2>&1
step startup 240 python3 bench/startup.py --repeat 3 --label gpu-light-tokenizer --out $R/startup.json
# issue 30: MoE routes, bf16, a tiny MoE and a Qwen3-30B-A3B-shaped one
step moe-tiny 420 python3 bench/moe.py --models tiny --out $R/moe-tiny
step moe-a3b 720 python3 bench/moe.py --models a3b-4l --out $R/moe-a3b
# issue 31: shared-seed sampling's cost on each engine; the full-distribution figures' cost
step sampling 420 python3 bench/sampling.py --model "$PARITY_DEMO_MODEL" --prompts 256 --tokens 128 --batch 64 --dtype bfloat16 --out $R/sampling.json
# issue 29: 1,000 rows x 512 tokens, the trainer side against bare HF teacher-forcing
step replay 600 python3 bench/replay.py --rows 1000 --tokens 512 --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --work /tmp/pb-replay --out $R/replay-speed.json
# issue 32: the 1,000-prompt scored workload on 2 replicas against 1 (same tokens asserted)
step cluster-scored 900 python3 bench/cluster.py --modes scored --prompts 1000 --no-in-process --out $R
# issue 33 item 5: the scored 1,000-prompt workload against the bare engines (whole and work ratios)
step workload-scored 600 python3 bench/workload.py --mode scored --prompts 1000 --tokens 128 --out $R/workload-scored.json
# issue 32: a free-running workload whose reference runs as 2 replicas
step cluster-free 600 python3 bench/cluster.py --modes free --free-prompts 32 --no-in-process --out $R/free
# issue 29: the parent's peak memory at 2,000 tokens a row (set by one chunk, not by the dump's length)
step replay-memory 420 python3 bench/replay.py --memory --rows 200 --tokens 2000 --chunk 64 --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --work /tmp/pb-replay --out $R/replay-memory.json
log done; touch $R/done
