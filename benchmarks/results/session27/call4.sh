#!/usr/bin/env bash
# session 27 call 4: EC-pose's parity protocol after the second capture fix (fill_ kernels), the aot
# test alone (its message), and the fast-path contract of PP-YOLOE and YOLO-NAS (call 3 ran out).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/results/session27/verify_new.py ec-s-pose > "$OUT/new-families.log" 2>&1
echo "new families rc=$?" >> "$OUT/new-families.log"
timeout 90 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -x \
  "tests/gpu/test_fastpath_gpu.py::test_aot_graph_equals_aot_eager[yolox-n]" > "$OUT/aot.log" 2>&1
echo "aot rc=$?" >> "$OUT/aot.log"
timeout "${T_CONTRACT:-250}" python3 scripts/fast_contract.py --families ppyoloe yolonas \
  --out "$OUT/fast_contract_new2.json" --markdown "$OUT/fast_contract_new2.md" > "$OUT/contract.log" 2>&1
echo "contract rc=$?" >> "$OUT/contract.log"
cat "$OUT/new-families.log"; grep -E "^E |FAILED|passed|failed|rc=" "$OUT/aot.log" | head -20
grep -E "^==|bitwise|rc=|Error" "$OUT/contract.log" | tail -20
