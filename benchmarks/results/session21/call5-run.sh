#!/usr/bin/env bash
# session 21 call 5: backward_into_grads (one foreach add instead of one add per parameter): the training
# capture suites on the GPU, then yolo9-t's whole step at 640, batch 16, fp16 and bf16
set -uo pipefail
PART=tests TESTS="tests/gpu/test_training_gpu.py tests/gpu/test_tasks_gpu.py tests/gpu/test_train_loop_gpu.py" \
  K="step0 or whole or accumulation or curve or trainer or seam or train_loop or async" T=230 WORKERS=4 \
  bash scripts/gpu-session.sh > /dev/null 2>&1
rm -f $OUT/json.tgz; tail -8 $OUT/gpu-tests.log
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
if ls .whl/*.whl >/dev/null 2>&1; then export PYTHONPATH="$PYTHONPATH:/tmp/site"; fi
for f in --fp16 --amp; do
  timeout 50 python3 benchmarks/train_step.py --all --arms whole --model yolo9t --batch 16 --imgsz 640 $f --channels-last \
    --runs 30 --warmup 5 --profile 10 --json $OUT/step-b16$f.json > /dev/null 2>&1; echo "step b16 $f rc=$?"
  python3 -c "
import json
d = json.load(open('$OUT/step-b16$f.json'))['arms']['whole']; p = d.get('profile', {})
print('$f', d.get('median_ms'), d.get('min_ms'), p.get('kernel_ms_per_step'), p.get('kernels_per_step'), list(p.get('groups', {}).items())[:5])"
done
