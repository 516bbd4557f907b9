#!/usr/bin/env bash
# The GPU checks of the 2026-11-26 fifth session (vLLM's rows a step per block: step_rows) on one lent
# GPU, started by bench/gpu_go.sh (under setsid, so it outlives one 10-minute call): results in
# /tmp/res, one file per step, steps.txt with their times and exit codes. Needs device-env.sh sourced.
# `touch /tmp/res/stop` skips steps not started yet. One step at a time: nothing else shares the GPU or
# the CPU while a figure is measured.
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; df -h /dev/shm /tmp; free -g; git log --oneline -1 2>/dev/null; } > $R/env.txt 2>&1
# issue 31: where the rows cost vLLM's generation, stage by stage, in one process
step rows-handoff 420 python3 bench/rows_handoff.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --rounds 2 --out $R/rows_handoff.json
# issue 31: the goal figure, the 1,000-prompt scored workload with against without the full distribution
step full-distribution 600 python3 bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --warm --like-for-like --out $R/full_distribution.json
log done; touch $R/done
