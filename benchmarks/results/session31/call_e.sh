#!/usr/bin/env bash
# Session 31, call E (carry .whl and .whlav: PyAV for cp312): the video rows call C could not run.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlav/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout -s INT 200 python3 -m pytest -p no:cacheprovider --timeout 150 --tb=short -v -rfEsxX tests/gpu/test_video_gpu.py > $W/video.log 2>&1
echo "video rc=$?" >> $W/video.log
cp $W/video.log "$OUT/"; tail -30 $W/video.log
