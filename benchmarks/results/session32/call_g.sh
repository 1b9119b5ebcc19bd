#!/usr/bin/env bash
# Session 32, call G (carry .whl .whlav - PyAV for cp312 - not .whlhf; the fixtures' tensors out of
# the copy): issue 38's owed fast-path suite (half / fast graphs == the same path eager, and
# fast="aot", whose package loads ended in a segmentation fault in session 23), the AOTInductor
# loaders probe that tells which way of loading works, the video rows that need PyAV, and
# issue 42's predict end to end on call F's trained weights (.keep/, carried) and its training
# step in channels_last.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlav/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
( timeout 240 python3 scripts/aot_load_probe.py > $W/aot-probe.log 2>&1; echo "aot probe rc=$?" >> $W/aot-probe.log ) &
( timeout -s INT 200 python3 -m pytest -p no:cacheprovider --timeout 150 --tb=short -v -rfEsxX tests/gpu/test_video_gpu.py > $W/video.log 2>&1
  echo "video rc=$?" >> $W/video.log ) &
timeout -s INT 330 python3 -m pytest -p no:cacheprovider -n 3 --timeout 320 --tb=short -v -rfEsxX --durations=10 \
  tests/gpu/test_fastpath_gpu.py > $W/fastpath.log 2>&1; echo "fastpath rc=$?" >> $W/fastpath.log
wait
# issue 42: predict end to end vs the graphed forward on call F's trained weights (carried as .keep/),
# alone on the card after the tests
for m in .keep/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  timeout 120 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=200 warmup=30 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
# issue 42's training step as the trainer runs it on CUDA: channels_last (the families' default;
# session 31's rows were contiguous), bfloat16 autocast, eager vs the whole captured step
for m in rtmdet-t-seg yolonas-n-pose; do
  timeout 150 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 --amp \
    --channels-last --runs 30 --warmup 5 --json $W/train-step-$m-bf16-cl.json > $W/train-step-$m-bf16-cl.log 2>&1
  echo "train step $m rc=$?" >> $W/train-step-$m-bf16-cl.log
done
tar czf "$OUT/all-g.tgz" -C $W . 2>/dev/null
{ grep -E "^(FAILED|ERROR|XPASS|XFAIL)|passed|failed|rc=" $W/video.log $W/fastpath.log | cut -c1-250
  for f in $W/bench-*.log; do tail -n 15 $f | cut -c1-250; done
  grep -hE '"median_ms"|speedup|rc=' $W/train-step-*-cl.log
  grep -E "^\{|rc=" $W/aot-probe.log | cut -c1-300; tail -5 $W/aot-probe.log | cut -c1-300
} > "$OUT/summary-g.txt" 2>&1
cat "$OUT/summary-g.txt"
