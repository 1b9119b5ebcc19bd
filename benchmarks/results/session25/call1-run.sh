#!/usr/bin/env bash
# session 25 call 1: the GPU suites after the trainer split (hooks, evaluate(), tune group) and the
# preprocessing-parity change (antialiased resizes inside the predict graph, new letterbox and crop
# rules): predict graphs, batched predict, validation graphs, training capture.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
T=${T:-300} WORKERS=4 PART=tests TESTS="${TESTS:-tests/gpu/test_graphs_gpu.py tests/gpu/test_batched_predict_gpu.py tests/gpu/test_valgraph_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_train_loop_gpu.py tests/gpu/test_tasks_gpu.py}" \
  bash scripts/gpu-session.sh > /dev/null
tail -30 $OUT/gpu-tests.log
