#!/usr/bin/env bash
# session 24 call 1: why fast="aot"'s package load crashed (scripts/aot_load_probe.py, each loader in
# its own process) beside the GPU training suites after issue 41's trainer changes, then the
# 30-epoch CLI (issue 16) once.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
( OMP_NUM_THREADS=4 LIBREYOLO_CACHE_DIR=/tmp/aotprobe timeout 300 python3 scripts/aot_load_probe.py --imgsz 320 \
    > $OUT/aot-load-probe.jsonl 2> $OUT/aot-load-probe.log; echo "probe rc=$?" >> $OUT/aot-load-probe.log ) &
T=420 WORKERS=3 PART=tests TESTS="tests/gpu/test_training_gpu.py tests/gpu/test_train_loop_gpu.py tests/gpu/test_tasks_gpu.py" \
  bash scripts/gpu-session.sh > /dev/null
wait
cut -c1-600 $OUT/aot-load-probe.jsonl; tail -3 $OUT/aot-load-probe.log
tail -15 $OUT/gpu-tests.log
CLI_ARMS="plain" T_CLI=70 PART=cli bash scripts/gpu-session.sh
