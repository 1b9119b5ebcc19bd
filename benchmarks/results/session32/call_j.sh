#!/usr/bin/env bash
# Session 32, call J (carry .whl .whlhf): EdgeTAM declared with bfloat16 autocast (its rows, the
# flag on) and CLIP / SigLIP 2's proof scripts (call H's archive did not come back).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
S=benchmarks/results/session31
( timeout 110 python3 $S/clip_predict.py > $W/clip-predict.log 2>&1; echo "clip predict rc=$?" >> $W/clip-predict.log ) &
( timeout 110 python3 $S/clip_text.py > $W/clip-text.log 2>&1; echo "clip text rc=$?" >> $W/clip-text.log ) &
timeout -s INT 120 python3 -m pytest -p no:cacheprovider -n 6 --timeout 110 --tb=short -q -rfEsxX \
  tests/gpu/test_segment_prompt_gpu.py tests/gpu/test_tasks_gpu.py -k "edgetam" > $W/edgetam.log 2>&1
echo "edgetam rc=$?" >> $W/edgetam.log
wait
cp $W/*.log "$OUT/"
grep -E "^(FAILED|ERROR|XPASS|XFAIL)|passed|failed|rc=" $W/edgetam.log | cut -c1-250; tail -6 $W/clip-predict.log $W/clip-text.log | cut -c1-300
