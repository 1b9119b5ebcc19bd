#!/usr/bin/env bash
# Session 31, call C: the rows call A's 380 s did not reach (left.txt), and SAM's failing predict row
# with its traceback. SIGINT on time-out so pytest still prints its summary.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
timeout -s INT 90 python3 -m pytest -p no:cacheprovider --timeout 80 --tb=long -rfEsxX \
  "tests/gpu/test_tasks_gpu.py::test_predict_with_graph_equals_eager[sam-base]" \
  "tests/gpu/test_tasks_gpu.py::test_parity_protocol_fp32_and_amp_batch_1_and_8[edgetam-edge]" \
  "tests/gpu/test_tasks_gpu.py::test_parity_protocol_fp32_and_amp_batch_1_and_8[sam-base]" \
  --runxfail > $W/sam.log 2>&1
echo "sam rc=$?" >> $W/sam.log
timeout -s INT 440 python3 -m pytest -p no:cacheprovider -n 8 --timeout 240 --tb=short -v -rfEsxX --durations=25 \
  --junitxml $W/junit-c.xml $(cat benchmarks/results/session31/left.txt) > $W/tests-c.log 2>&1
echo "tests rc=$?" >> $W/tests-c.log
tar czf "$OUT/all-c.tgz" -C $W . 2>/dev/null
{ grep -E "^(FAILED|ERROR|XPASS|XFAIL)|Error|sam rc" $W/sam.log | head -20
  grep -E "^(FAILED|ERROR|XPASS|XFAIL)" $W/tests-c.log | cut -c1-250; grep -E "passed|failed" $W/tests-c.log | tail -1; tail -1 $W/tests-c.log
} > "$OUT/summary-c.txt" 2>&1
cut -c1-330 "$OUT/summary-c.txt" | tail -80
