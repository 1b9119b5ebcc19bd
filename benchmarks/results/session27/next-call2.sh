#!/usr/bin/env bash
# The second call of the next GPU session (carry .whl): YOLO-NAS's fast-path contract (its session-27
# run came before its graph flag and was refused), then the aot test alone with time to finish (it
# failed in session 27 with its message lost, and ran past 90 s alone).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 200 python3 scripts/fast_contract.py --families yolonas --out "$OUT/fast_contract_yolonas.json" \
  --markdown "$OUT/fast_contract_yolonas.md" > "$OUT/contract.log" 2>&1; echo "contract rc=$?" >> "$OUT/contract.log"
timeout 300 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=long -x -s \
  "tests/gpu/test_fastpath_gpu.py::test_aot_graph_equals_aot_eager[yolox-n]" > "$OUT/aot.log" 2>&1
echo "aot rc=$?" >> "$OUT/aot.log"
grep -E "^==|bitwise|rc=" "$OUT/contract.log"; tail -40 "$OUT/aot.log"
