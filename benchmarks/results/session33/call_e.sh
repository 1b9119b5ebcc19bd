#!/usr/bin/env bash
# Session 33, call E (carry .whl .whlav; the fixtures' tensors out of the copy): the last start the
# device time allows after eight failed ones, cut to about 210 s. In parallel: the batched-predict
# rows (BGR frames reordered on the device vs the host, eager and graph), the fast="aot" rows and the
# AOTInductor loaders probe, the video rows. Then alone: yolonas-n-pose predict end to end (bench).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlav/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
T0=$(date +%s)
( timeout 150 python3 scripts/aot_load_probe.py > $W/aot-probe.log 2>&1; echo "aot probe rc=$?" >> $W/aot-probe.log ) &
( timeout -s INT 140 python3 -m pytest -p no:cacheprovider --timeout 130 --tb=short -v -rfEsxX tests/gpu/test_video_gpu.py > $W/video.log 2>&1
  echo "video rc=$?" >> $W/video.log ) &
( timeout -s INT 150 python3 -m pytest -p no:cacheprovider -n 2 --timeout 140 --tb=short -v -rfEsxX tests/gpu/test_fastpath_gpu.py -k aot > $W/aot-rows.log 2>&1
  echo "aot rows rc=$?" >> $W/aot-rows.log ) &
timeout -s INT 150 python3 -m pytest -p no:cacheprovider --timeout 140 --tb=short -v -rfEsxX tests/gpu/test_batched_predict_gpu.py > $W/batched.log 2>&1
echo "batched rc=$?" >> $W/batched.log
wait
echo "phase 1: $(( $(date +%s) - T0 )) s" > $W/times.log
timeout 45 python3 -m libreyolo.cli bench model=yolonas-n-pose imgsz=640 batch=1 compile=false runs=150 warmup=30 \
  json=$W/bench-yolonas-n-pose.json > $W/bench-yolonas-n-pose.log 2>&1; echo "bench rc=$?" >> $W/bench-yolonas-n-pose.log
echo "all: $(( $(date +%s) - T0 )) s" >> $W/times.log
tar czf "$OUT/all-e.tgz" -C $W . 2>/dev/null
{ cat $W/times.log
  grep -E "^(FAILED|ERROR|XPASS|XFAIL)|PASSED|passed|failed|rc=" $W/video.log $W/aot-rows.log $W/batched.log | cut -c1-250
  grep -E "^\{|rc=" $W/aot-probe.log | cut -c1-300; tail -3 $W/aot-probe.log | cut -c1-300
  grep -E "predict\(graph\) /|stages|rc=|predict_graph|forward_graph" $W/bench-yolonas-n-pose.log | cut -c1-200
} > "$OUT/summary-e.txt" 2>&1
cat "$OUT/summary-e.txt"
