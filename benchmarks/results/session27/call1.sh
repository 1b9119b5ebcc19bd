#!/usr/bin/env bash
# session 27 call 1: the three GPU failures session 26 named, alone with full tracebacks, then the
# owed suites (predict graphs, batched predict, validation graphs, training, train loop, other tasks)
# verbose, so what fails is named even if the time limit cuts pytest short.
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/env.txt" 2>&1
python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)" >> "$OUT/env.txt" 2>&1
timeout 100 python3 -m pytest -m cuda -p no:cacheprovider -v --tb=long \
  "tests/gpu/test_graphs_gpu.py::test_capture_graph_covers_the_following_requests" \
  "tests/gpu/test_batched_predict_gpu.py::test_gpu_decode_same_size_chunks_equal_the_decoded_arrays_predicted" \
  > "$OUT/known.log" 2>&1
echo "known rc=$?" >> "$OUT/known.log"
python3 -c "
from libreyolo.tasks import TASKS
for task, data in (('detect', 'shapes'), ('classify', 'shapes-cls'), ('semantic', 'shapes-seg')):
    if task in TASKS:
        TASKS[task].resolve_data(data)
" > "$OUT/suites.log" 2>&1
timeout "${T:-420}" python3 -m pytest -m cuda -p no:cacheprovider -v --tb=short -rf --timeout=240 -n 4 \
  tests/gpu/test_graphs_gpu.py tests/gpu/test_batched_predict_gpu.py tests/gpu/test_valgraph_gpu.py \
  tests/gpu/test_training_gpu.py tests/gpu/test_train_loop_gpu.py tests/gpu/test_tasks_gpu.py \
  --junitxml="$OUT/suites.xml" >> "$OUT/suites.log" 2>&1
echo "suites rc=$?" >> "$OUT/suites.log"
grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/known.log" "$OUT/suites.log" | tail -40
