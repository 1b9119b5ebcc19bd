#!/usr/bin/env bash
# Session 30, GPU call 1 (carry .whl .whlhf; the fixtures' tensors out of the copy): every owed row
# at once - the GPU task rows (new families' GRAPH_PENDING rows, RTMDet-Ins / YOLO-NAS-Pose training
# after the EMA / recipe / loss changes), the detection training rows (EMA), session 29's call 3
# (EC-seg seam, YOLOv1, tiled predict), prompts / video / AMG / TensorRT, YOLOv2 verify, ZipDepth,
# and issue 42's 30-epoch quality run beside them (a quality figure, not a timing).
set -uo pipefail
export OUT="${OUT:-.out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > "$OUT/env.log" 2>&1
export LIBREYOLO_DATASETS_DIR=/tmp/ds
( timeout 420 python3 benchmarks/task_quality.py --models rtmdet-t-segment yolonas-n-pose --epochs 30 --imgsz 320 \
    --batch 16 --cuda-graph --json "$OUT/quality.json" > "$OUT/quality.log" 2>&1; echo "quality rc=$?" >> "$OUT/quality.log" ) &
( timeout 120 python3 benchmarks/results/session27/verify_new.py yolo2-t yolo2-b > "$OUT/yolo2-verify.log" 2>&1
  echo "yolo2 verify rc=$?" >> "$OUT/yolo2-verify.log"
  timeout 150 python3 benchmarks/results/session30/zipdepth.py > "$OUT/zipdepth.log" 2>&1; echo "zipdepth rc=$?" >> "$OUT/zipdepth.log" ) &
timeout 520 python3 -m pytest -m cuda -p no:cacheprovider -n 5 --timeout 300 --tb=short -rfEsxX --durations=25 \
  --junitxml "$OUT/junit.xml" tests/gpu/test_tasks_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_dfine_seg_gpu.py \
  tests/gpu/test_yolo1_gpu.py tests/gpu/test_sliced_gpu.py tests/gpu/test_segment_prompt_gpu.py tests/gpu/test_video_gpu.py \
  tests/unit/test_amg.py tests/unit/test_export_tensorrt.py tests/unit/test_darknet.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
wait
tail -4 "$OUT/quality.log"; tail -3 "$OUT/yolo2-verify.log" "$OUT/zipdepth.log"
grep -E "^(FAILED|ERROR|XPASS|XFAIL)" "$OUT/tests.log" | cut -c1-220 | head -80; tail -2 "$OUT/tests.log"
