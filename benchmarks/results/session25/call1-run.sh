#!/usr/bin/env bash
# session 25 call 1: the GPU suites after the trainer split (hooks, evaluate(), tune group) and the
# preprocessing-parity change (antialiased resizes inside the predict graph, new letterbox and crop
# rules): predict graphs, batched predict, validation graphs, training capture; then the 30-epoch CLI.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
T=400 WORKERS=4 PART=tests TESTS="tests/gpu/test_graphs_gpu.py tests/gpu/test_batched_predict_gpu.py tests/gpu/test_valgraph_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_train_loop_gpu.py tests/gpu/test_tasks_gpu.py tests/gpu/test_segment_prompt_gpu.py tests/gpu/test_ocr_gpu.py" \
  bash scripts/gpu-session.sh > /dev/null
tail -25 $OUT/gpu-tests.log
CLI_ARMS="plain" T_CLI=70 PART=cli bash scripts/gpu-session.sh
