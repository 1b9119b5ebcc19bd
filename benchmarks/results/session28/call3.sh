#!/usr/bin/env bash
# Session 28, GPU call 3 (carry .whl): after call 1,
# 1. RTMDet-Ins's two bilinear resizes take the deterministic backward (ops/interpolate.py): its
#    AdamW whole-step row (moved 2.5x eager's noise in call 1) and every rtmdet-t-segment row again,
#    with the parity protocol of its predict (the forward is the same call);
# 2. yolonas-n-pose's trainer row after the test's assumption (two graphs) was corrected;
# 3. the new EC segment variant's parity protocol, and the variant rows of dfine-n-segment and
#    yolonas-s-obb now in VARIANT_GRAPH_MODELS.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/results/session27/verify_new.py ec-s-segment rtmdet-t-segment > "$OUT/verify.log" 2>&1
echo "verify rc=$?" >> "$OUT/verify.log"
timeout 300 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_tasks_gpu.py \
  -k "rtmdet-t-segment or yolonas-n-pose or dfine-n-segment or yolonas-s-obb" -o junit_family=xunit1 \
  --junitxml="$OUT/variants.xml" > "$OUT/variants.log" 2>&1; echo "variants rc=$?" >> "$OUT/variants.log"
grep -hE "FAILED|passed|failed|rc=" "$OUT"/*.log | tail -30; cat "$OUT/verify.log"
