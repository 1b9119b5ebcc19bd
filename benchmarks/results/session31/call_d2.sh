#!/usr/bin/env bash
# Session 31, call D2 (what the last device minutes allow): the set-image prompt rows of the newly
# declared SAM 2, SAM 3 and PicoSAM3 and the segment predict rows after the mask windows.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout -s INT 100 python3 -m pytest -p no:cacheprovider -n 8 --timeout 90 --tb=line -q -rfEsxX \
  tests/gpu/test_segment_prompt_gpu.py tests/gpu/test_tasks_gpu.py \
  -k "(test_prompt_calls and (sam2 or sam3 or picosam3)) or (predict_with_graph and seg)" > $W/d2.log 2>&1
echo "rc=$?" >> $W/d2.log
cp $W/d2.log "$OUT/"; tail -25 $W/d2.log
