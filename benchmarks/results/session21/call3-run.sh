#!/usr/bin/env bash
# session 21 call 3: yolo9-t's training step at 640 (issue 16's step targets) on today's code; picodet-s's fp16 overflow probe
set -uo pipefail
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
J=/tmp/c3; mkdir -p $J
for spec in 16:--amp 16:--fp16 64:--amp 64:--fp16; do
  b=${spec%%:*}; f=${spec##*:}
  timeout 100 python3 benchmarks/train_step.py --all --arms whole --model yolo9t --batch $b --imgsz 640 $f --channels-last \
    --runs 30 --warmup 5 --profile 10 --json $J/step-b$b$f.json > $J/step-b$b$f.log 2>&1; echo "step b$b $f rc=$?" >> $J/step-b$b$f.log
  python3 -c "
import json,sys
try: d=json.load(open('$J/step-b$b$f.json'))
except Exception as e: print('b$b $f', 'no json', e); sys.exit()
d=d["arms"]["whole"]; p=d.get('profile', {})
print('b$b $f median', d.get('median_ms'), 'min', d.get('min_ms'), 'kernels ms', p.get('kernel_ms_per_step'), 'n', p.get('kernels_per_step'))
print('  ', list(p.get('groups', {}).items())[:6])"
done
timeout 300 python3 scripts/half_overflow_probe.py --family picodet --epochs 30 --precision fp16 --json $J/picodet-probe.json \
  --save $J/picodet-s-shapes.pt > $J/picodet-probe.log 2>&1; echo "probe rc=$?" >> $J/picodet-probe.log
grep -v "batch/s\|img/s" $J/picodet-probe.log | tail -25
cd $J && tar czf $OUT/c3.tgz --exclude=*.pt . && cp $J/picodet-s-shapes.pt $OUT/ 2>/dev/null; ls -la $J
