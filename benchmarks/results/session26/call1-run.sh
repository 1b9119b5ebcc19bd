#!/usr/bin/env bash
# session 26 call 1: the GPU suites owed since the trainer split, the preprocessing-parity change and
# the predictor/fast-path split (predict graphs, batched predict, validation graphs, training capture,
# the other tasks), first the parity protocol of the families and task variants whose flags wait for it
# (verify_new.py).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/session26/verify_new.py > "$OUT/new-families.log" 2>&1
echo "new families rc=$?" >> "$OUT/new-families.log"
T=${T:-330} WORKERS=4 PART=tests TESTS="${TESTS:-tests/gpu/test_graphs_gpu.py tests/gpu/test_batched_predict_gpu.py tests/gpu/test_valgraph_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_train_loop_gpu.py tests/gpu/test_tasks_gpu.py}" \
  bash scripts/gpu-session.sh > /dev/null
tail -30 "$OUT/gpu-tests.log"; echo ----; cat "$OUT/new-families.log"
