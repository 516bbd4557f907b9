#!/usr/bin/env bash
# The GPU checks of the 2026-11-26 third session on a lent 2-GPU machine, started by bench/gpu_go.sh
# (under setsid, so it outlives one 10-minute call): results in /tmp/res, one file per step, steps.txt
# with their times and exit codes. Needs device-env.sh sourced. `touch /tmp/res/stop` skips steps not
# started yet. First the step that needs both GPUs; then two chains in parallel, one per GPU.
source "$(dirname "$0")/../../gpu_steps.sh"  # R, log, step (bench/gpu_steps.sh; cd to the project root)
mkdir -p $R/free
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch, ray; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"; nproc; } > $R/env.txt 2>&1
# issue 32: a free-running workload whose HF reference runs as 2 replicas (one per GPU) against 1
step cluster-free 480 python3 bench/cluster.py --modes free --free-prompts 32 --chunk 8 --no-in-process --out $R/free
(
  export CUDA_VISIBLE_DEVICES=0
  # issue 31: shared-seed sampling's cost on each engine (the vLLM leg needs its cold compile: ~100 s)
  step sampling 600 python3 bench/sampling.py --model "$PARITY_DEMO_MODEL" --prompts 256 --tokens 128 --batch 64 --dtype bfloat16 --out $R/sampling.json
  # issue 31: the full-distribution figures on the 1,000-prompt scored workload, with against without
  step full-distribution 600 python3 bench/full_distribution.py --model "$PARITY_DEMO_MODEL" --prompts 1000 --tokens 128 --batch 256 --chunk 250 --dtype bfloat16 --out $R/full_distribution.json
) &
G0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  # issue 29: replay 1,000 rows x 512 tokens, the trainer side against bare HF teacher-forcing
  step replay 600 python3 bench/replay.py --rows 1000 --tokens 512 --model "$PARITY_DEMO_MODEL" --dtype bfloat16 --work /tmp/pb-replay --out $R/replay-speed.json
  # issue 33 item 5: the scored 1,000-prompt workload against the bare engines (whole and work ratios)
  step workload-scored 600 python3 bench/workload.py --mode scored --prompts 1000 --tokens 128 --work /tmp/pb-workload --out $R/workload-scored.json
  # the same with the reference's scoring in one call (no overlap with the parent's work): what the overlap gives
  step workload-scored-one-piece 600 env PARITY_BENCH_ONE_PIECE=1 python3 bench/workload.py --mode scored --prompts 1000 --tokens 128 --work /tmp/pb-workload-one --out $R/workload-scored-one-piece.json
) &
wait $G0 $!
log done; touch $R/done
