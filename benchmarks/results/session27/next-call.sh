#!/usr/bin/env bash
# The first call of the next GPU session (carry .whl), queued at the end of session 27:
# 1. the parity protocol of the variants added after its GPU runs (dfine-n-seg, yolonas-s-obb);
# 2. the task-variant rows of the other-task suite (parity, graph predict == eager, and the
#    training rows of rtmdet-t-segment and yolonas-n-pose);
# 3. the detection curves with cuDNN's deterministic kernels (settles yolo9_e2e / ppyoloe training);
# 4. the DETR families' predict and seam rows again (the D-FINE decoder and detr_postprocess gained
#    flag-gated outputs for the segment variant: the detectors' outputs must be unchanged).
# The second call: next-call2.sh.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 90 python3 benchmarks/results/session27/verify_new.py dfine-n-segment yolonas-s-obb > "$OUT/new-families.log" 2>&1
echo "new families rc=$?" >> "$OUT/new-families.log"
timeout 200 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_tasks_gpu.py \
  -k "segment or pose or obb" > "$OUT/variants.log" 2>&1; echo "variants rc=$?" >> "$OUT/variants.log"
timeout 150 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_training_gpu.py \
  -k "deterministic or seam" > "$OUT/train.log" 2>&1; echo "train rc=$?" >> "$OUT/train.log"
timeout 100 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_graphs_gpu.py \
  -k "dfine or deim or rtdetr" > "$OUT/detr.log" 2>&1; echo "detr rc=$?" >> "$OUT/detr.log"
grep -hE "FAILED|passed|failed|rc=" "$OUT"/*.log | tail -30; cat "$OUT/new-families.log"
