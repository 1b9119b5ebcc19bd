#!/usr/bin/env bash
# Session 29, GPU call 3 (carry .whl): after the CPU fixes - EC-seg's seam (only used parameters),
# verify's "+post" cases at conf 0.001 (YOLOv1, YOLOv2), tiled predict's CPU comparison.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 75 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 4 tests/gpu/test_dfine_seg_gpu.py \
  tests/gpu/test_yolo1_gpu.py -k "ec-s-segment or parity" > "$OUT/seam_yolo1.log" 2>&1; echo "seam+yolo1 rc=$?" >> "$OUT/seam_yolo1.log"
timeout 60 python3 benchmarks/results/session27/verify_new.py yolo2-t yolo2-b > "$OUT/yolo2-verify.log" 2>&1; echo "yolo2 verify rc=$?" >> "$OUT/yolo2-verify.log"
timeout 50 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 2 tests/gpu/test_sliced_gpu.py > "$OUT/sliced.log" 2>&1; echo "sliced rc=$?" >> "$OUT/sliced.log"
grep -hE "FAILED|PASSED|passed|failed|rc=" "$OUT"/*.log | tail -30; grep -v UNTRAINED "$OUT/yolo2-verify.log" | tail -12
