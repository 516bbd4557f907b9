#!/usr/bin/env bash
# The GPU checks of the 2026-11-26 fourth session, fourth round (side-stream copies, bits only, parallel writes) on one lent GPU, started by bench/gpu_go.sh (under
# setsid, so it outlives one 10-minute call): results in /tmp/res, one file per step, steps.txt with
# their times and exit codes. Needs device-env.sh sourced. `touch /tmp/res/stop` skips steps not
# started yet. One step at a time: nothing else shares the GPU or the CPU while a figure is measured.
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; df -h /dev/shm /tmp; free -g; git log --oneline -1; } > $R/env.txt 2>&1
# issue 31: the full-distribution figures on the 1,000-prompt scored workload, with against without
# (rows in memory now, bfloat16 bits, vLLM's copies not waited for, the scoring in pieces)
step full-distribution 600 python3 bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --warm --like-for-like --out $R/full_distribution.json

log done; touch $R/done
