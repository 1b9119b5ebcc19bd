#!/usr/bin/env bash
# Session 34, call D (carry .whl; the fixtures' tensors out of the copy): instance masks by the
# fused Triton kernel (libreyolo.ops.mask_sample) - its bits against the tensor way, its time
# against the grid_sample sampling it replaces (alone on the card), the segment / pose predict
# rows beside RTMDet-Ins's default quality run with the weights kept and YOLO-NAS-Pose's with its
# new default lr0 (1e-3) under the default float16 autocast over seeds 0-2, then predict end to
# end on the RTMDet-Ins weights, alone on the card (about 300 s).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work-d; mkdir -p "$OUT" $W/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
timeout -s INT 80 python3 -m pytest -p no:cacheprovider --timeout 70 --tb=short -q -rfEsxX tests/gpu/test_mask_sample_gpu.py \
  > $W/mask-kernel.log 2>&1; echo "mask kernel rc=$?" >> $W/mask-kernel.log
for n in 138; do
  timeout 40 python3 benchmarks/segment_masks.py --device cuda --instances $n --runs 20 --warmup 3 > $W/masks-$n.log 2>&1
  echo "masks $n rc=$?" >> $W/masks-$n.log
done
python3 -c "from libreyolo.tasks.segment.data import make_shapes_inst_dataset as m; m()" > /dev/null 2>&1
python3 -c "from libreyolo.tasks.pose.synthetic import make_shapes_pose_dataset as m; m()" > /dev/null 2>&1
# YOLO-NAS-Pose's new default (lr0 1e-3) under the default float16 autocast, three seeds side by side
for s in 0 1 2; do ( timeout 150 python3 benchmarks/task_quality.py --models yolonas-n-pose --epochs 30 --imgsz 320 --batch 16 \
    --cuda-graph --seed $s --json $W/q-pose-s$s.json > $W/q-pose-s$s.log 2>&1; echo "pose s$s rc=$?" >> $W/q-pose-s$s.log ) & done
( timeout 120 python3 benchmarks/task_quality.py --models rtmdet-t-segment --epochs 30 --imgsz 320 --batch 16 --cuda-graph \
    --keep $W/keep --json $W/q-seg.json > $W/q-seg.log 2>&1; echo "seg quality rc=$?" >> $W/q-seg.log ) &
timeout -s INT 110 python3 -m pytest -p no:cacheprovider -n 3 --timeout 100 --tb=short -q -rfEsxX \
  tests/gpu/test_tasks_gpu.py -k "(predict_with_graph or select_in_the_stage) and (seg or pose)" > $W/seg-rows.log 2>&1
echo "seg rows rc=$?" >> $W/seg-rows.log
wait
for m in $W/keep/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  timeout 45 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=150 warmup=20 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
rm -rf $W/keep
tar czf "$OUT/all-d.tgz" -C $W . 2>/dev/null
{ grep -E "^(FAILED|ERROR)|passed|failed|rc=" $W/mask-kernel.log $W/seg-rows.log | cut -c1-250
  cat $W/masks-*.log
  for f in $W/q-*.log; do tr '\r' '\n' < $f | grep -E '^\{|rc=' | cut -c1-330; done
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=" $f; done
} > "$OUT/summary-d.txt" 2>&1
cat "$OUT/summary-d.txt"
