#!/usr/bin/env bash
# session 27 call 3: EC-pose's parity protocol after the capture fix (its level sizes written on the
# device), YOLO-NAS (s, n-pose) with the calibrated re-draw, the new families' training rows again
# (YOLO-NAS's accumulation row with the unused-parameter fix; the two curve rows that failed in
# call 2, once more, reported as a second sample), the fast-path suite (owed since the NaN change,
# aot included), and the fast-path contract of the four new detection families.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/results/session27/verify_new.py ec-s-pose yolonas-s yolonas-n-pose > "$OUT/new-families.log" 2>&1
echo "new families rc=$?" >> "$OUT/new-families.log"
timeout 150 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 tests/gpu/test_training_gpu.py \
  -k "yolonas or (curve and ((fwd_bwd and yolo9_e2e) or (whole and ppyoloe)))" > "$OUT/train.log" 2>&1
echo "train rc=$?" >> "$OUT/train.log"
timeout 150 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 2 tests/gpu/test_fastpath_gpu.py \
  > "$OUT/fastpath.log" 2>&1
echo "fastpath rc=$?" >> "$OUT/fastpath.log"
timeout "${T_CONTRACT:-230}" python3 scripts/fast_contract.py --families yolo9_p2 yolo9_e2e ppyoloe yolonas \
  --out "$OUT/fast_contract_new.json" --markdown "$OUT/fast_contract_new.md" > "$OUT/contract.log" 2>&1
echo "contract rc=$?" >> "$OUT/contract.log"
cat "$OUT/new-families.log"; grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/train.log" "$OUT/fastpath.log" | tail -20
grep -E "^==|bitwise|rc=|Error" "$OUT/contract.log" | tail -20
