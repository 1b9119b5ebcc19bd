#!/usr/bin/env bash
# Session 31, call A of two (B: call_b.sh, right after on the warm machine). Originally (carry .whl .whlhf; the fixtures' tensors out of the copy): what session
# 30's call lost (its logs came back only in part: at most 8 files return, so everything now goes
# into one archive) - every owed GPU row, YOLOv2 verify, ZipDepth - and issue 42's quality question:
# YOLO-NAS-Pose reached OKS mAP50 0.07 on the GPU (graph, float16 autocast) where the same recipe
# reached 0.30 on the CPU (fp32, eager): the arms below tell graph from autocast. Then a profile of
# predict for the pose and segment variants (end to end 1.6x / 2.8x the graphed forward on an H100).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
pack() { tar czf "$OUT/all.tgz" -C $W . 2>/dev/null; }
{ nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > $W/env.log 2>&1
quality() {  # $1 arm name, rest: task_quality options
  local arm=$1; shift
  timeout 330 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 \
    --batch 16 "$@" --json $W/quality-$arm.json > $W/quality-$arm.log 2>&1; echo "quality $arm rc=$?" >> $W/quality-$arm.log
}
( quality graph-fp16 --cuda-graph ) &
( sleep 20; quality eager-fp16 ) &
( sleep 40; quality graph-fp32 --cuda-graph --amp false ) &
( timeout 100 python3 benchmarks/results/session27/verify_new.py yolo2-t yolo2-b > $W/yolo2-verify.log 2>&1
  echo "yolo2 verify rc=$?" >> $W/yolo2-verify.log
  timeout 120 python3 benchmarks/results/session30/zipdepth.py > $W/zipdepth.log 2>&1; echo "zipdepth rc=$?" >> $W/zipdepth.log ) &
timeout 380 python3 -m pytest -m cuda -p no:cacheprovider -n 6 --timeout 240 --tb=short -v -rfEsxX --durations=25 \
  --junitxml $W/junit.xml tests/gpu/test_tasks_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_dfine_seg_gpu.py \
  tests/gpu/test_yolo1_gpu.py tests/gpu/test_sliced_gpu.py tests/gpu/test_segment_prompt_gpu.py tests/gpu/test_video_gpu.py \
  tests/unit/test_amg.py tests/unit/test_export_tensorrt.py tests/unit/test_darknet.py tests/gpu/test_graphs_gpu.py \
  tests/gpu/test_batched_predict_gpu.py tests/gpu/test_valgraph_gpu.py > $W/tests.log 2>&1
echo "tests rc=$?" >> $W/tests.log; pack
wait; pack
{ for f in $W/quality-*.log; do tr '\r' '\n' < "$f" | grep -E '^\{|rc='; done
  tail -2 $W/yolo2-verify.log $W/zipdepth.log
  grep -E "^(FAILED|ERROR|XPASS|XFAIL)" $W/tests.log | cut -c1-200; grep -E "passed|failed" $W/tests.log | tail -1; tail -1 $W/tests.log
} > "$OUT/summary.txt" 2>&1
cut -c1-330 "$OUT/summary.txt" | tail -120
