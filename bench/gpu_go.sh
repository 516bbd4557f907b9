#!/usr/bin/env bash
# bench/gpu_go.sh SCRIPT DEADLINE_EPOCH: on the lent GPU machine, start SCRIPT (a chain of measurements
# writing into /tmp/res) once in its own session, so that it outlives one 10-minute call; wait until it
# touches /tmp/res/done or the deadline passes; pack /tmp/res into $OUT/res.tgz and say where it stands.
# Call it again (same SCRIPT) on the same held machine to keep waiting: it never starts SCRIPT twice.
cd "$(dirname "$0")/.."
mkdir -p /tmp/res
if [ ! -f /tmp/res/launched ]; then
  touch /tmp/res/launched
  setsid nohup bash "$1" > /tmp/res/master.log 2>&1 < /dev/null &
fi
while [ ! -f /tmp/res/done ] && [ "$(date +%s)" -lt "$2" ]; do sleep 3; done
tar czf "$OUT/res.tgz" -C /tmp res
echo "== steps"; cat /tmp/res/steps.txt 2>/dev/null
for f in /tmp/res/*.err; do [ -s "$f" ] && { echo "== $f"; tail -8 "$f"; }; done
nvidia-smi --query-gpu=memory.used --format=csv,noheader
