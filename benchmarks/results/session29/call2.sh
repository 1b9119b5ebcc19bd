#!/usr/bin/env bash
# Session 29, GPU call 2 (carry .whl): YOLOv2-v4's and YOLO-NAS-OBB's training rows, tiled predict on
# CUDA, then issue 42's 30-epoch quality check of rtmdet-t-seg and yolonas-n-pose.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 4 tests/gpu/test_training_gpu.py \
  tests/gpu/test_tasks_gpu.py tests/gpu/test_sliced_gpu.py -k "yolo2 or yolo3 or yolo4 or yolonas-s-obb or ec-s-segment or sliced" \
  > "$OUT/train.log" 2>&1; echo "train rc=$?" >> "$OUT/train.log"
timeout 200 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 \
  --batch 16 --cuda-graph --json "$OUT/quality.json" > "$OUT/quality.log" 2>&1; echo "quality rc=$?" >> "$OUT/quality.log"
grep '^{' "$OUT/quality.log"
grep -hE "FAILED|ERROR|passed|failed|rc=" "$OUT"/*.log | tail -40
