#!/usr/bin/env bash
# session 23 call 2: why fast="aot"'s package load crashed in call 1 (scripts/aot_load_probe.py: a toy
# package and yolox-n's, each loader in its own process), then the 30-epoch CLI (issue 16) once.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 LIBREYOLO_CACHE_DIR=/tmp/aotprobe
timeout 190 python3 scripts/aot_load_probe.py --imgsz 320 > $OUT/aot-load-probe.jsonl 2> $OUT/aot-load-probe.log
echo "probe rc=$?" >> $OUT/aot-load-probe.log
cut -c1-700 $OUT/aot-load-probe.jsonl
unset LIBREYOLO_CACHE_DIR
CLI_ARMS="plain" T_CLI=70 PART=cli bash scripts/gpu-session.sh
