#!/usr/bin/env bash
# The GPU checks of the 2026-11-26 fourth session on one lent GPU, started by bench/gpu_go.sh (under
# setsid, so it outlives one 10-minute call): results in /tmp/res, one file per step, steps.txt with
# their times and exit codes. Needs device-env.sh sourced. `touch /tmp/res/stop` skips steps not
# started yet. One step at a time: nothing else shares the GPU or the CPU while a figure is measured.
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; df -h /dev/shm /tmp; free -g; git log --oneline -1; } > $R/env.txt 2>&1
# issue 31: the full-distribution figures on the 1,000-prompt scored workload, with against without
# (rows in memory now, bfloat16 bits, vLLM's copies not waited for, the scoring in pieces)
step full-distribution 600 python3 bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --out $R/full_distribution.json
# issue 29: what the HF engine's score_batch costs beyond bare teacher-forcing, in one process, alternating legs
step hf-score 300 python3 bench/hf_score.py --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --rows 200 --tokens 512 --repeat 3 --out $R/hf-score.json
# issue 29: replay 1,000 rows x 512 tokens, the trainer side against bare HF teacher-forcing, alone on the machine
step replay 600 python3 bench/replay.py --rows 1000 --tokens 512 --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --work /tmp/pb-replay --out $R/replay-speed.json
log done; touch $R/done
