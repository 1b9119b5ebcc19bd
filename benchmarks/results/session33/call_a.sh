#!/usr/bin/env bash
# Session 33, call A (carry .whl .whlav - PyAV for cp312 - not .whlhf; the fixtures' tensors out of
# the copy): session 32's call G, which it replaces (issue 38's owed fast-path suite with fast="aot", the AOTInductor
# loaders probe, the video rows) and the batched-predict rows with BGR frames reordered on the
# device (Predictor.bgr_on_device) against the host's reorder, eager and graph; then, alone on the
# card, the classifiers' end-to-end latency after that change (the 720p frame's host reorder gone).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlav/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
( timeout 240 python3 scripts/aot_load_probe.py > $W/aot-probe.log 2>&1; echo "aot probe rc=$?" >> $W/aot-probe.log ) &
( timeout -s INT 200 python3 -m pytest -p no:cacheprovider --timeout 150 --tb=short -v -rfEsxX tests/gpu/test_video_gpu.py > $W/video.log 2>&1
  echo "video rc=$?" >> $W/video.log ) &
( timeout -s INT 240 python3 -m pytest -p no:cacheprovider --timeout 200 --tb=short -v -rfEsxX tests/gpu/test_batched_predict_gpu.py > $W/batched.log 2>&1
  echo "batched rc=$?" >> $W/batched.log ) &
timeout -s INT 330 python3 -m pytest -p no:cacheprovider -n 3 --timeout 320 --tb=short -v -rfEsxX --durations=10 \
  tests/gpu/test_fastpath_gpu.py > $W/fastpath.log 2>&1; echo "fastpath rc=$?" >> $W/fastpath.log
wait
for m in "resnet 18" "efficientnetv2 b0"; do n=${m/ /-}
  timeout 60 python3 scripts/classify_latency.py --model $m --calls 5 --out $W/lat > $W/lat-$n.log 2>&1; echo "latency $n rc=$?" >> $W/lat-$n.log
done
tar czf "$OUT/all-a.tgz" -C $W . 2>/dev/null
{ grep -E "^(FAILED|ERROR|XPASS|XFAIL)|passed|failed|rc=" $W/video.log $W/fastpath.log $W/batched.log | cut -c1-250
  grep -E "^\{|rc=" $W/aot-probe.log | cut -c1-300; tail -5 $W/aot-probe.log | cut -c1-300
  for f in $W/lat-*.log; do grep -iE "end.to.end|forward|rc=" $f | head -8 | cut -c1-250; done
} > "$OUT/summary-a.txt" 2>&1
cat "$OUT/summary-a.txt"
