#!/usr/bin/env bash
# session 27 call 2: the five GPU tests fixed after call 1 (their assumptions were wrong, see
# README.md), the parity protocol of the new families / task variants (verify_new.py), and the
# training-step parity of the new detection families (their rows of rows.TRAIN_GRAPH_MODELS).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
python3 -c "from libreyolo.tasks import TASKS; TASKS['detect'].resolve_data('shapes')" > /dev/null 2>&1
timeout 120 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 3 \
  "tests/gpu/test_graphs_gpu.py::test_capture_graph_covers_the_following_requests" \
  "tests/gpu/test_batched_predict_gpu.py::test_gpu_decode_same_size_chunks_equal_the_decoded_arrays_predicted" \
  "tests/gpu/test_tasks_gpu.py::test_predict_with_graph_equals_eager" > "$OUT/fixed.log" 2>&1
echo "fixed rc=$?" >> "$OUT/fixed.log"
timeout "${T_NEW:-230}" python3 benchmarks/results/session27/verify_new.py > "$OUT/new-families.log" 2>&1 &
NEW=$!
timeout "${T_TRAIN:-230}" python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -n 2 tests/gpu/test_training_gpu.py \
  -k "yolo9_p2 or yolo9_e2e or ppyoloe or yolonas" > "$OUT/train.log" 2>&1
echo "train rc=$?" >> "$OUT/train.log"
wait $NEW; echo "new families rc=$?" >> "$OUT/new-families.log"
grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/fixed.log" "$OUT/train.log" | tail -30; cat "$OUT/new-families.log"
