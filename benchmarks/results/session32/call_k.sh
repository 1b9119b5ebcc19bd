#!/usr/bin/env bash
# Session 32, call K (queued; carry .whl .whlhf; the fixtures' tensors out of the copy), after or
# instead of call G: issue 42's figures on an H200 - the training step as the trainer runs it
# (channels_last is now train_step.py's default for these families), predict end to end on freshly
# trained weights after the masks went back to whole-image sampling on CUDA - the segment predict
# rows after that change, and SAM 2's video fps with two warm-ups.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
( timeout 250 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 --batch 16 \
    --cuda-graph --keep $W/keep --json $W/quality-k.json > $W/quality-k.log 2>&1; echo "quality rc=$?" >> $W/quality-k.log ) &
timeout -s INT 240 python3 -m pytest -p no:cacheprovider -n 4 --timeout 200 --tb=short -q -rfEsxX \
  tests/gpu/test_tasks_gpu.py -k "(predict_with_graph or select_in_the_stage) and (seg or pose)" > $W/seg-rows.log 2>&1
echo "seg rows rc=$?" >> $W/seg-rows.log
wait
# alone on the card from here
for m in $W/keep/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  timeout 60 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=200 warmup=30 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
for m in rtmdet-t-seg yolonas-n-pose; do
  timeout 70 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 --amp \
    --runs 20 --warmup 5 --json $W/train-step-$m-bf16.json > $W/train-step-$m-bf16.log 2>&1
  echo "train step $m rc=$?" >> $W/train-step-$m-bf16.log
done
timeout 90 python3 benchmarks/results/session31/sam2_video.py > $W/sam2-video.log 2>&1; echo "sam2 video rc=$?" >> $W/sam2-video.log
rm -rf $W/keep
tar czf "$OUT/all-k.tgz" -C $W . 2>/dev/null
{ tr '\r' '\n' < $W/quality-k.log | grep -E '^\{|rc=' | cut -c1-300
  grep -E "^(FAILED|ERROR)|passed|failed|rc=" $W/seg-rows.log | cut -c1-200
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=" $f; done
  grep -hE '"median_ms"|speedup|rc=' $W/train-step-*.log; tail -n 2 $W/sam2-video.log
} > "$OUT/summary-k.txt" 2>&1
cat "$OUT/summary-k.txt"
