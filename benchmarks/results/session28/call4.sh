#!/usr/bin/env bash
# Session 28, GPU call 4 (carry .whl): the merged CPU work's GPU rows: D-FINE-seg's training seam
# (tests/gpu/test_dfine_seg_gpu.py), YOLO-NAS-OBB's training rows (its new loss), YOLOv1's parity
# protocol at 448, graph predict == eager and training capture (tests/gpu/test_yolo1_gpu.py); then
# the 30-epoch quality check of rtmdet-t-seg and yolonas-n-pose (benchmarks/task_quality.py).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_dfine_seg_gpu.py \
  tests/gpu/test_yolo1_gpu.py > "$OUT/seam_yolo1.log" 2>&1; echo "seam+yolo1 rc=$?" >> "$OUT/seam_yolo1.log"
timeout 100 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_tasks_gpu.py \
  -k "yolonas-s-obb or ec-s-segment" > "$OUT/obb_train.log" 2>&1; echo "obb rc=$?" >> "$OUT/obb_train.log"
# the quality check: 30 epochs at 320 on the built-in sets (mask / OKS mAP50 >= 0.5)
timeout 180 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 \
  --batch 16 --cuda-graph --json "$OUT/quality.json" > "$OUT/quality.log" 2>&1; echo "quality rc=$?" >> "$OUT/quality.log"
grep '^{' "$OUT/quality.log"
grep -hE "FAILED|passed|failed|rc=" "$OUT"/*.log | tail -30
