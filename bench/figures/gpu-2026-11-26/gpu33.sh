#!/usr/bin/env bash
# Issue 33's GPU checks in one background chain on the lent GPU machine (started by gpu33-go.sh beside it
# under setsid, so it outlives a 10-minute call): results in /tmp/res. `touch /tmp/res/stop` skips
# the items not started yet. Needs device-env.sh sourced.
R=/tmp/res; mkdir -p $R; cd "$(dirname "$0")/../../.."  # the project root
H=bench/figures/gpu-2026-11-26  # this chain's folder: its CLI wrapper and prompt files
export PARITY_DB=$R/runs.db HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log() { echo "$(date +%s) $*" >> $R/steps.txt; }
jid() { python3 -c "import json,sys
for l in open(sys.argv[1]):
    if l.startswith('{'):
        print(json.loads(l)[sys.argv[2]]); break" "$@"; }
log start
{ nvidia-smi; python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"; nproc; } > $R/env.txt 2>&1
# item 1: HF fp32 reference vs vLLM bf16 + CUDA graphs + prefix caching, 8 chat prompts x 64 tokens; then bisect
log a-compare-start
timeout 420 python3 $H/gpu33_cli.py compare --model demo --prompt-file $H/gpu33-chat-prompts.jsonl --chat \
  --set max_new_tokens=64 --side ref=hf,dtype=float32 \
  --side b=vllm,dtype=bfloat16,enforce_eager=false,enable_prefix_caching=true --json > $R/a-compare.json 2> $R/a-compare.err
log a-compare-end rc=$?
RUN=$(jid $R/a-compare.json run_id)
if [ -n "$RUN" ]; then
  log a-bisect-start $RUN
  timeout 1100 python3 $H/gpu33_cli.py bisect $RUN --max-trials 8 --json > $R/a-bisect.json 2> $R/a-bisect.err
  log a-bisect-end rc=$?
  BID=$(jid $R/a-bisect.json bisect_id)
  python3 -m parity_ui.cli runs show $BID --json > $R/a-bisect-show.json 2>&1
  python3 -m parity_ui.cli runs show $BID > $R/a-bisect-show.txt 2>&1
  python3 -m parity_ui.cli runs show $RUN > $R/a-compare-show.txt 2>&1
fi
log a-done
[ -f $R/stop ] && { log stopped-before-b; touch $R/done; exit 0; }
# item 2: random-weight Llama-3-8B-shaped model, scored workload with the default sides and floor
log b-build-start
timeout 400 python3 bench/gpu33_build_llama8b.py --out /tmp/llama8b --layers ${LAYERS:-32} > $R/b-build.txt 2>&1
log b-build-end rc=$?
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 500 > $R/b-smi.csv 2>&1 &
SMI=$!
log b-compare-start
timeout 560 python3 $H/gpu33_cli.py compare --model /tmp/llama8b --prompt-file $H/gpu33-scored-prompts.jsonl \
  --mode scored --set max_new_tokens=32 --json > $R/b-compare.json 2> $R/b-compare.err
log b-compare-end rc=$?
sleep 2; kill $SMI
RUN=$(jid $R/b-compare.json run_id)
[ -n "$RUN" ] && python3 -m parity_ui.cli runs show $RUN > $R/b-compare-show.txt 2>&1
rm -rf /tmp/llama8b
log b-done
[ -f $R/stop ] && { log stopped-before-c; touch $R/done; exit 0; }
# item 4: startup.py as written (its PYTHONPATH is the tool root alone), then with a tool root that
# also holds /tmp/site's packages (vLLM's deps and sqlite-utils live there on this machine)
log c-start
timeout 120 python3 bench/startup.py --label after --repeat 3 --out $R/startup-gpu-default.json > $R/c-startup-default.txt 2>&1
log c-default-end rc=$?
mkdir -p /tmp/tr && ln -sf /tmp/site/* /tmp/tr/ && ln -sfn "$PWD/parity_ui" /tmp/tr/parity_ui
timeout 300 python3 bench/startup.py --tool-root /tmp/tr --label after --repeat 3 --out $R/startup-gpu.json > $R/c-startup.txt 2>&1
log c-end rc=$?
touch $R/done
