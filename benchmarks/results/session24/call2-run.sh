#!/usr/bin/env bash
# session 24 call 2: the aot load probe again (call 1's build found no cache folder).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
OMP_NUM_THREADS=4 LIBREYOLO_CACHE_DIR=/tmp/aotprobe timeout 400 python3 scripts/aot_load_probe.py --imgsz 320 \
    > $OUT/aot-load-probe.jsonl 2> $OUT/aot-load-probe.log; echo "probe rc=$?" >> $OUT/aot-load-probe.log
cut -c1-900 $OUT/aot-load-probe.jsonl; tail -3 $OUT/aot-load-probe.log
