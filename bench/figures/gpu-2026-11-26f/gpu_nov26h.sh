#!/usr/bin/env bash
# The GPU checks of the 2026-11-26 fifth session, third round: the goal figure once more on a fresh
# machine (the step log and the pinned gather). Started by bench/gpu_go.sh; results in /tmp/res.
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; df -h /dev/shm /tmp; free -g; } > $R/env.txt 2>&1
step full-distribution 600 python3 bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --warm --like-for-like --out $R/full_distribution.json
log done; touch $R/done
