#!/usr/bin/env bash
# Session 29, GPU call 1 (carry .whl and .gpucarry): first the flagged families whose code changed on
# the CPU since their last GPU run (PP-OCR's fused copy; Depth Anything V2 and BiRefNet, whose modules
# Depth Anything 3 and FeyNobg extended), with the new dense families' rows; PP-OCR's graph speedup
# on a dense page with real weights (issue 44's GPU target); then YOLOv1-v4 (parity protocol, graph
# predict == eager, their losses captured) and the D-FINE-seg / EC-seg training seams.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 140 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 4 tests/gpu/test_ocr_gpu.py \
  tests/gpu/test_tasks_gpu.py -k "ppocr or ocr or depth_anything or birefnet or feynobg or pidnet or lingbotvision or segformer or zipdepth" \
  > "$OUT/dense_ocr.log" 2>&1; echo "dense+ocr rc=$?" >> "$OUT/dense_ocr.log"
timeout 50 python3 benchmarks/ocr_graph_speedup.py --checkpoint .gpucarry/ppocr-v4.pt --page .gpucarry/dense.png \
  --runs 30 --json "$OUT/ocr_speed.json" > "$OUT/ocr_speed.log" 2>&1; echo "ocr speed rc=$?" >> "$OUT/ocr_speed.log"
timeout 100 python3 benchmarks/results/session27/verify_new.py yolo2-t yolo2-b yolo3-t yolo3-b yolo3-spp yolo4-t \
  yolo4-b > "$OUT/darknet-verify.log" 2>&1; echo "darknet verify rc=$?" >> "$OUT/darknet-verify.log"
timeout 120 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 4 tests/unit/test_darknet.py \
  tests/gpu/test_yolo1_gpu.py tests/gpu/test_dfine_seg_gpu.py > "$OUT/units.log" 2>&1; echo "units rc=$?" >> "$OUT/units.log"
grep -hE "FAILED|ERROR|passed|failed|rc=" "$OUT"/*.log | tail -40; cat "$OUT/ocr_speed.log"; grep -v UNTRAINED "$OUT/darknet-verify.log" | tail -30
