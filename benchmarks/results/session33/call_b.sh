#!/usr/bin/env bash
# Session 33, call B (carry .whl .whlhf; the fixtures' tensors out of the copy), right after call A on
# the warm machine: session 32's call K (issue 42's figures), which it replaces: 30 epochs at 320 of
# rtmdet-t-seg and yolonas-n-pose with the weights kept, the segment / pose predict rows, then alone
# on the card: predict end to end on those weights (the masks sampled over whole images on CUDA, BGR
# frames reordered on the device), the training step as the trainer runs it (channels_last bf16,
# 16 x 640), RTMDet-Ins's under torch.profiler (where its device time goes), and SAM 2's video fps
# with two warm-ups (limits sum to about 570 s).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
( timeout 250 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 --batch 16 \
    --cuda-graph --keep $W/keep --json $W/quality-b.json > $W/quality-b.log 2>&1; echo "quality rc=$?" >> $W/quality-b.log ) &
timeout -s INT 240 python3 -m pytest -p no:cacheprovider -n 4 --timeout 200 --tb=short -q -rfEsxX \
  tests/gpu/test_tasks_gpu.py -k "(predict_with_graph or select_in_the_stage) and (seg or pose)" > $W/seg-rows.log 2>&1
echo "seg rows rc=$?" >> $W/seg-rows.log
wait
# alone on the card from here
for m in $W/keep/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  timeout 50 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=200 warmup=30 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
for m in yolonas-n-pose rtmdet-t-seg; do
  prof=""; [ $m = rtmdet-t-seg ] && prof="--profile 3"
  timeout 80 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 --amp \
    --runs 20 --warmup 5 $prof --json $W/train-step-$m-bf16.json > $W/train-step-$m-bf16.log 2>&1
  echo "train step $m rc=$?" >> $W/train-step-$m-bf16.log
done
timeout 60 python3 benchmarks/results/session31/sam2_video.py > $W/sam2-video.log 2>&1; echo "sam2 video rc=$?" >> $W/sam2-video.log
rm -rf $W/keep
tar czf "$OUT/all-b.tgz" -C $W . 2>/dev/null
{ tr '\r' '\n' < $W/quality-b.log | grep -E '^\{|rc=' | cut -c1-300
  grep -E "^(FAILED|ERROR)|passed|failed|rc=" $W/seg-rows.log | cut -c1-200
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=" $f; done
  grep -hE '"median_ms"|speedup|rc=' $W/train-step-*.log; tail -n 2 $W/sam2-video.log
} > "$OUT/summary-b.txt" 2>&1
cat "$OUT/summary-b.txt"
