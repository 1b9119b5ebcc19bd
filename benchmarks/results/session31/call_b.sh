#!/usr/bin/env bash
# Session 31, call B (after call_a.sh, alone on the machine): issue 42's training-step arms (bf16 and
# fp32), predict profiles of the pose and segment variants, issue 38's efficientnetv2-b0 latency.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
nvidia-smi -L > $W/env-b.log 2>&1
for m in yolonas-n-pose rtmdet-t-seg; do
  timeout 45 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 --amp \
    --runs 30 --warmup 5 --json $W/train-step-$m-bf16.json > $W/train-step-$m-bf16.log 2>&1
  echo "train_step $m bf16 rc=$?" >> $W/train-step-$m-bf16.log
done
timeout 45 python3 benchmarks/train_step.py --all --arms eager,whole --model yolonas-n-pose --batch 16 --imgsz 640 \
  --runs 30 --warmup 5 --json $W/train-step-yolonas-n-pose-fp32.json > $W/train-step-yolonas-n-pose-fp32.log 2>&1
for m in yolonas-n-pose rtmdet-t-seg; do
  timeout 35 python3 scripts/profile_predict.py $m 640 $W/prof-$m > $W/prof-$m.log 2>&1; echo "profile $m rc=$?" >> $W/prof-$m.log
done
timeout 60 python3 scripts/classify_latency.py --model efficientnetv2 b0 --calls 20 --out $W/lat > $W/lat.log 2>&1; echo "latency rc=$?" >> $W/lat.log
tar czf "$OUT/all-b.tgz" -C $W . 2>/dev/null
{ for f in $W/train-step-*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {a: v.get('median_ms', v) for a, v in d['arms'].items()}, d.get('speedup_whole'))" "$f" 2>&1 | cut -c1-300; done
  tail -3 $W/train-step-*.log $W/prof-*.log $W/lat.log
} > "$OUT/summary-b.txt" 2>&1
cut -c1-330 "$OUT/summary-b.txt" | tail -80
