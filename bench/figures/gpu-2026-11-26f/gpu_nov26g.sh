#!/usr/bin/env bash
# The GPU checks of the 2026-11-26 fifth session, second round: the HF reference's side of meeting
# vLLM's rows (bench/rows_meet.py), vLLM's side again with more rounds (the first's baseline varied
# 7.3-9.5 s), and the goal figure again. Started by bench/gpu_go.sh; results in /tmp/res (steps.txt).
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; df -h /dev/shm /tmp; free -g; } > $R/env.txt 2>&1
step rows-meet 300 python3 bench/rows_meet.py --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --sequences 250 --tokens 128 --rounds 3 --out $R/rows_meet.json
step rows-handoff 420 python3 bench/rows_handoff.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --rounds 4 --out $R/rows_handoff.json
step full-distribution 600 python3 bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --warm --like-for-like --out $R/full_distribution.json
log done; touch $R/done
