#!/usr/bin/env bash
# Session 33, call D (carry .whl .whlav; the fixtures' tensors out of the copy): call C cut to about
# 320 s for the device time left after seven failed starts. In parallel: the fast-path suite with
# fast="aot", the AOTInductor loaders probe, the video rows, the batched-predict rows (BGR frames
# reordered on the device vs the host). Then alone on the card: predict end to end of yolonas-n-pose
# and rtmdet-t-seg (untrained, re-drawn input-sensitive by bench: a full load) - the masks sampled
# over whole images on CUDA, BGR frames reordered on the device.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlav/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
T0=$(date +%s)
( timeout 180 python3 scripts/aot_load_probe.py > $W/aot-probe.log 2>&1; echo "aot probe rc=$?" >> $W/aot-probe.log ) &
( timeout -s INT 150 python3 -m pytest -p no:cacheprovider --timeout 140 --tb=short -v -rfEsxX tests/gpu/test_video_gpu.py > $W/video.log 2>&1
  echo "video rc=$?" >> $W/video.log ) &
( timeout -s INT 180 python3 -m pytest -p no:cacheprovider --timeout 170 --tb=short -v -rfEsxX tests/gpu/test_batched_predict_gpu.py > $W/batched.log 2>&1
  echo "batched rc=$?" >> $W/batched.log ) &
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -n 4 --timeout 190 --tb=short -v -rfEsxX --durations=10 \
  tests/gpu/test_fastpath_gpu.py > $W/fastpath.log 2>&1; echo "fastpath rc=$?" >> $W/fastpath.log
wait
echo "phase 1: $(( $(date +%s) - T0 )) s" > $W/times.log
for m in yolonas-n-pose rtmdet-t-seg; do
  timeout 50 python3 -m libreyolo.cli bench model=$m imgsz=640 batch=1 compile=false runs=150 warmup=30 \
    json=$W/bench-$m.json > $W/bench-$m.log 2>&1; echo "bench $m rc=$?" >> $W/bench-$m.log
done
echo "all: $(( $(date +%s) - T0 )) s" >> $W/times.log
tar czf "$OUT/all-d.tgz" -C $W . 2>/dev/null
{ cat $W/times.log
  grep -E "^(FAILED|ERROR|XPASS|XFAIL)|passed|failed|rc=" $W/video.log $W/fastpath.log $W/batched.log | cut -c1-250
  grep -E "^\{|rc=" $W/aot-probe.log | cut -c1-300; tail -3 $W/aot-probe.log | cut -c1-300
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=" $f; done
} > "$OUT/summary-d.txt" 2>&1
cat "$OUT/summary-d.txt"
