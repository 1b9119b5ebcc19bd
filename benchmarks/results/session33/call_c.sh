#!/usr/bin/env bash
# Session 33, call C (carry .whl .whlav; the fixtures' tensors out of the copy): calls A and B in
# one, for when the device time left allows one call (five starts failed first). In parallel: the
# fast-path suite with fast="aot", the AOTInductor loaders probe, the video rows, the
# batched-predict rows (BGR frames reordered on the device vs the host), issue 42's 30 epochs at
# 320 of rtmdet-t-seg and yolonas-n-pose with the weights kept. Then alone on the card: predict end
# to end on those weights, RTMDet-Ins's training step (channels_last bf16, 16 x 640) under
# torch.profiler. (Cut to fit the device time left: about 440 s.)
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlav/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
T0=$(date +%s)
( timeout 200 python3 scripts/aot_load_probe.py > $W/aot-probe.log 2>&1; echo "aot probe rc=$?" >> $W/aot-probe.log ) &
( timeout -s INT 180 python3 -m pytest -p no:cacheprovider --timeout 150 --tb=short -v -rfEsxX tests/gpu/test_video_gpu.py > $W/video.log 2>&1
  echo "video rc=$?" >> $W/video.log ) &
( timeout -s INT 200 python3 -m pytest -p no:cacheprovider --timeout 180 --tb=short -v -rfEsxX tests/gpu/test_batched_predict_gpu.py > $W/batched.log 2>&1
  echo "batched rc=$?" >> $W/batched.log ) &
( timeout 250 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 --batch 16 \
    --cuda-graph --keep $W/keep --json $W/quality-c.json > $W/quality-c.log 2>&1; echo "quality rc=$?" >> $W/quality-c.log ) &
timeout -s INT 250 python3 -m pytest -p no:cacheprovider -n 4 --timeout 240 --tb=short -v -rfEsxX --durations=10 \
  tests/gpu/test_fastpath_gpu.py > $W/fastpath.log 2>&1; echo "fastpath rc=$?" >> $W/fastpath.log
wait
echo "phase 1: $(( $(date +%s) - T0 )) s" > $W/times.log
# alone on the card from here
for m in $W/keep/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  timeout 50 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=200 warmup=30 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
rm -rf $W/keep
timeout 70 python3 benchmarks/train_step.py --all --arms eager,whole --model rtmdet-t-seg --batch 16 --imgsz 640 --amp \
  --runs 10 --warmup 3 --profile 3 --json $W/train-step-rtmdet-t-seg-bf16.json > $W/train-step-rtmdet-t-seg-bf16.log 2>&1
echo "train step rc=$?" >> $W/train-step-rtmdet-t-seg-bf16.log
echo "all: $(( $(date +%s) - T0 )) s" >> $W/times.log
tar czf "$OUT/all-c.tgz" -C $W . 2>/dev/null
{ cat $W/times.log
  grep -E "^(FAILED|ERROR|XPASS|XFAIL)|passed|failed|rc=" $W/video.log $W/fastpath.log $W/batched.log | cut -c1-250
  grep -E "^\{|rc=" $W/aot-probe.log | cut -c1-300; tail -3 $W/aot-probe.log | cut -c1-300
  tr '\r' '\n' < $W/quality-c.log | grep -E '^\{|rc=' | cut -c1-300
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=" $f; done
  grep -hE '"median_ms"|speedup|rc=' $W/train-step-*.log | cut -c1-400
} > "$OUT/summary-c.txt" 2>&1
cat "$OUT/summary-c.txt"
