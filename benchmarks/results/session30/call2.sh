#!/usr/bin/env bash
# Session 30, GPU call 2 (carry .whl): issue 42 on the GPU, alone on the machine - the 30-epoch
# quality run (320, built-in sets, --cuda-graph; the trained models kept), then on those trained
# weights predict at batch 1, 640 (graphed forward vs end to end), and the whole training step vs
# eager at batch 16, 640, for rtmdet-t-seg and yolonas-n-pose (and yolonas-s-obb beside them).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
K=/tmp/keep
timeout 240 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose yolonas-s-obb --epochs 30 \
  --imgsz 320 --batch 16 --cuda-graph --json "$OUT/quality.json" --keep $K > "$OUT/quality.log" 2>&1
echo "quality rc=$?" >> "$OUT/quality.log"
for m in rtmdet-t-segment yolonas-n-pose yolonas-s-obb; do
  src=$K/$m.pt; [ -f "$src" ] || src=$(echo $m | sed 's/-segment$/-seg/')   # untrained if the run failed
  timeout 90 python3 -m libreyolo.cli bench model=$src imgsz=640 batch=1 compile=false runs=200 warmup=30 \
    json="$OUT/bench-$m.json" > "$OUT/bench-$m.log" 2>&1; echo "bench $m rc=$?" >> "$OUT/bench-$m.log"
done
for m in rtmdet-t-seg yolonas-n-pose; do
  timeout 150 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 \
    --runs 50 --warmup 10 --json "$OUT/train-step-$m.json" > "$OUT/train-step-$m.log" 2>&1
  echo "train_step $m rc=$?" >> "$OUT/train-step-$m.log"
  timeout 150 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 --amp \
    --runs 50 --warmup 10 --json "$OUT/train-step-$m-bf16.json" > "$OUT/train-step-$m-bf16.log" 2>&1
  echo "train_step bf16 $m rc=$?" >> "$OUT/train-step-$m-bf16.log"
done
grep -h "^{" "$OUT/quality.log" | cut -c1-400; tail -1 "$OUT/quality.log"
for f in "$OUT"/bench-*.log; do echo "== $f"; grep -E "forward|predict|captured|rc=" "$f"; done
for f in "$OUT"/train-step-*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {a: v.get('median_ms', v) for a, v in d['arms'].items()}, d.get('speedup_whole'))" "$f"; done
tail -3 "$OUT"/train-step-*.log | cut -c1-300
