#!/usr/bin/env bash
# Session 30, GPU call 1 (carry .whl .whlhf; the fixtures' tensors out of the copy). Part 1, the
# machine shared: every owed GPU row (the new families' GRAPH_PENDING rows; RTMDet-Ins / YOLO-NAS-Pose
# after the EMA / recipe / loss / in-stage NMS changes; the detection and DETR training rows after the
# EMA change; session 29's call 3: EC-seg seam, YOLOv1, tiled predict; prompts, video, AMG, TensorRT),
# YOLOv2 verify, ZipDepth, and issue 42's 30-epoch quality run (a quality figure, not a timing).
# Part 2, the machine alone: predict at batch 1, 640 on the trained weights (graphed forward vs end to
# end) and the whole training step vs eager at batch 16, 640 (issue 42's H200 targets).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
{ nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > "$OUT/env.log" 2>&1
K=/tmp/keep
( timeout 330 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose yolonas-s-obb --epochs 30 \
    --imgsz 320 --batch 16 --cuda-graph --json "$OUT/quality.json" --keep $K > "$OUT/quality.log" 2>&1
  echo "quality rc=$?" >> "$OUT/quality.log" ) &
( timeout 100 python3 benchmarks/results/session27/verify_new.py yolo2-t yolo2-b > "$OUT/yolo2-verify.log" 2>&1
  echo "yolo2 verify rc=$?" >> "$OUT/yolo2-verify.log"
  timeout 120 python3 benchmarks/results/session30/zipdepth.py > "$OUT/zipdepth.log" 2>&1; echo "zipdepth rc=$?" >> "$OUT/zipdepth.log" ) &
timeout 330 python3 -m pytest -m cuda -p no:cacheprovider -n 6 --timeout 240 --tb=short -v -rfEsxX --durations=25 \
  tests/gpu/test_tasks_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_dfine_seg_gpu.py \
  tests/gpu/test_yolo1_gpu.py tests/gpu/test_sliced_gpu.py tests/gpu/test_segment_prompt_gpu.py tests/gpu/test_video_gpu.py \
  tests/unit/test_amg.py tests/unit/test_export_tensorrt.py tests/unit/test_darknet.py tests/gpu/test_graphs_gpu.py \
  tests/gpu/test_batched_predict_gpu.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
wait
# part 2: alone on the machine
for m in rtmdet-t-segment yolonas-n-pose yolonas-s-obb; do
  src=$K/$m.pt; [ -f "$src" ] || src=$(echo $m | sed 's/-segment$/-seg/')   # untrained if the run failed
  timeout 40 python3 -m libreyolo.cli bench model=$src imgsz=640 batch=1 compile=false runs=200 warmup=30 \
    json="$OUT/bench-$m.json" > "$OUT/bench-$m.log" 2>&1; echo "bench $m ($src) rc=$?" >> "$OUT/bench-$m.log"
done
for m in rtmdet-t-seg yolonas-n-pose; do
  timeout 45 python3 benchmarks/train_step.py --all --arms eager,whole --model $m --batch 16 --imgsz 640 \
    --runs 30 --warmup 5 --json "$OUT/train-step-$m-fp32.json" > "$OUT/train-step-$m-fp32.log" 2>&1
  echo "train_step $m fp32 rc=$?" >> "$OUT/train-step-$m-fp32.log"
done
timeout 40 python3 scripts/classify_latency.py --model resnet 18 --calls 5 --out "$OUT/lat" > "$OUT/classify-latency.log" 2>&1
echo "classify_latency rc=$?" >> "$OUT/classify-latency.log"
grep -h "^{" "$OUT/quality.log" | cut -c1-330; tail -1 "$OUT/quality.log"; tail -2 "$OUT/yolo2-verify.log" "$OUT/zipdepth.log"
grep -E "^(FAILED|ERROR|XPASS|XFAIL)" "$OUT/tests.log" | cut -c1-200 | head -60; grep -E "passed|failed" "$OUT/tests.log" | tail -2; tail -1 "$OUT/tests.log"
for f in "$OUT"/bench-*.log; do grep -E "forward_graph|predict_graph|rc=" "$f"; done
for f in "$OUT"/train-step-*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {a: v.get('median_ms', v) for a, v in d['arms'].items()}, d.get('speedup_whole'))" "$f" 2>&1 | cut -c1-300; done
grep -iE "end to end|end-to-end|median|rc=" "$OUT/classify-latency.log" | head -12
