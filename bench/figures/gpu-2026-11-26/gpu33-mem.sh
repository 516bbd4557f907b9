#!/usr/bin/env bash
# Issue 33 item 2 again, with per-process GPU memory (which side takes what): results in $OUT.
cd "$(dirname "$0")/../../.."; R=$OUT; H=bench/figures/gpu-2026-11-26; export PARITY_DB=$R/runs2.db
timeout 200 python3 bench/gpu33_build_llama8b.py --out /tmp/llama8b > $R/m-build.txt 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 500 > $R/m-smi.csv 2>&1 &
A=$!
( while :; do echo "T $(date +%s.%N)"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; ps -eo pid,args | grep -E "parity_ui|vllm|EngineCore" | grep -v grep | cut -c1-160; sleep 0.5; done ) > $R/m-apps.txt 2>&1 &
B=$!
timeout 400 python3 $H/gpu33_cli.py compare --model /tmp/llama8b --prompt-file $H/gpu33-scored-prompts.jsonl --mode scored --set max_new_tokens=32 --json > $R/m-compare.json 2> $R/m-compare.err
echo rc=$?; sleep 2; kill $A $B
tail -3 $R/m-compare.err; grep -o 'GPU memory plan[^"]*' $R/m-compare.json | head -1
python3 -c "
v=[int(l.split(',')[1]) for l in open('$R/m-smi.csv') if l.count(',')==2]; print('peak MiB', max(v))"
