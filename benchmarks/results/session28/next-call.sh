#!/usr/bin/env bash
# The next GPU session's first call (carry .whl), queued at the end of session 28: the GPU rows of
# the families and training added in session 28 that no GPU has run yet.
# 1. YOLOv2-v4 (every size) through the parity protocol and graph predict == eager; their loss
#    captured == eager (tests/unit/test_darknet.py's cuda rows) and their training rows
#    (TRAIN_GRAPH_MODELS);
# 2. YOLOv1 (tests/gpu/test_yolo1_gpu.py: parity at 448, predict, training capture);
# 3. the D-FINE-seg training seam (tests/gpu/test_dfine_seg_gpu.py). (call4.sh holds YOLO-NAS-OBB's
#    training rows and the 30-epoch quality check, if it did not run in session 28.)
# Set SUPPORTS_CUDA_GRAPH* only where they pass (docs/families.md names the rows).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/session27/verify_new.py yolo2-t yolo2-b yolo3-t yolo3-b yolo3-spp yolo4-t \
  yolo4-b > "$OUT/darknet-verify.log" 2>&1; echo "darknet verify rc=$?" >> "$OUT/darknet-verify.log"
timeout 200 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/unit/test_darknet.py \
  tests/gpu/test_yolo1_gpu.py tests/gpu/test_dfine_seg_gpu.py > "$OUT/units.log" 2>&1; echo "units rc=$?" >> "$OUT/units.log"
timeout 200 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_training_gpu.py \
  -k "yolo2 or yolo3 or yolo4" > "$OUT/train.log" 2>&1; echo "train rc=$?" >> "$OUT/train.log"
# 4. the flagged families whose shared modules the new ones extended (outputs bitwise unchanged on
#    the CPU): Depth Anything V2 (Depth Anything 3 shares its encoder and DPT head) and BiRefNet
#    (FeyNobg: a SwinConfig argument), with the new families' own rows (pending: xfail strict;
#    PIDNet and LingBot-Vision among the semantic rows)
timeout 150 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_tasks_gpu.py \
  -k "depth_anything or birefnet or feynobg or pidnet or lingbotvision or segformer" > "$OUT/dense.log" 2>&1; echo "dense rc=$?" >> "$OUT/dense.log"
# 5. tiled / test-time-augmented predict on CUDA (engine/sliced.py): graph == eager, one graph per
#    tile batch, the CPU's boxes
timeout 120 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short tests/gpu/test_sliced_gpu.py \
  > "$OUT/sliced.log" 2>&1; echo "sliced rc=$?" >> "$OUT/sliced.log"
# 6. PP-OCR's fused copy after the CPU speed work (ConvAct, the folded affines, the DB head's
#    pixel shuffle, the FPN without autograd): its GPU rows, not re-proven since
timeout 150 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short tests/gpu/test_ocr_gpu.py \
  tests/gpu/test_tasks_gpu.py -k "ppocr or ocr" > "$OUT/ocr.log" 2>&1; echo "ocr rc=$?" >> "$OUT/ocr.log"
grep -hE "FAILED|passed|failed|rc=" "$OUT"/*.log | tail -30; cat "$OUT/darknet-verify.log" | grep -v UNTRAINED
