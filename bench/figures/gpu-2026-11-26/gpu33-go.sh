#!/usr/bin/env bash
# bench/figures/gpu-2026-11-26/gpu33-go.sh DEADLINE_EPOCH: start gpu33.sh (beside it) in its own session once, wait until it is done
# or the deadline, then pack /tmp/res into $OUT/res.tgz and print where it stands.
cd "$(dirname "$0")/../../.."  # the project root
mkdir -p /tmp/res
if [ ! -f /tmp/res/launched ]; then
  touch /tmp/res/launched
  setsid nohup bash bench/figures/gpu-2026-11-26/gpu33.sh > /tmp/res/master.log 2>&1 < /dev/null &
fi
while [ ! -f /tmp/res/done ] && [ "$(date +%s)" -lt "$1" ]; do sleep 3; done
tar czf "$OUT/res.tgz" -C /tmp res
echo "== steps"; cat /tmp/res/steps.txt
for f in /tmp/res/*.err /tmp/res/b-build.txt /tmp/res/c-startup*.txt; do [ -f "$f" ] && { echo "== $f"; tail -25 "$f"; }; done
nvidia-smi --query-gpu=memory.used --format=csv,noheader
