#!/usr/bin/env bash
# Session 33, call F (carry .whl; the fixtures' tensors out of the copy): with under 250 s of device
# time left, only this session's new CUDA code: BGR frames reordered on the device equal the host's
# reorder (batch 1 and 3, eager and graph, yolox-n and yolo9-t), and the rest of the batched rows.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout -s INT 120 python3 -m pytest -p no:cacheprovider --timeout 110 --tb=short -v -rfEsxX --durations=5 \
  tests/gpu/test_batched_predict_gpu.py 2>&1 | tee $W/batched.log | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | cut -c1-220
cp $W/batched.log "$OUT/batched.log"
