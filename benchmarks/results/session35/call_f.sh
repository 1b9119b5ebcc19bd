#!/usr/bin/env bash
# Session 35, call F (carry .whl): the fused mask kernel on (FUSED_ON_CUDA = True): the segment
# predict / validation rows and the mask-kernel test, then RTMDet-Ins's default quality run with
# the weights kept and `libreyolo bench` on them (predict end to end against the graphed forward).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work-f; mkdir -p "$OUT" $W/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
python3 -c "from libreyolo.tasks.segment.data import make_shapes_inst_dataset as m; m()" > /dev/null 2>&1
( timeout 120 python3 benchmarks/task_quality.py --models rtmdet-t-segment --epochs 30 --imgsz 320 --batch 16 --cuda-graph \
    --keep $W/keep --json $W/q-seg.json > $W/q-seg.log 2>&1; echo "seg quality rc=$?" >> $W/q-seg.log ) &
timeout -s INT 110 python3 -m pytest -p no:cacheprovider -n 3 --timeout 100 --tb=short -q -rfEsxX \
  tests/gpu/test_mask_sample_gpu.py tests/gpu/test_tasks_gpu.py -k "mask or seg" > $W/seg-rows.log 2>&1
echo "seg rows rc=$?" >> $W/seg-rows.log
wait
for m in $W/keep/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  timeout 45 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=150 warmup=20 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
rm -rf $W/keep
tar czf "$OUT/all-f.tgz" -C $W . 2>/dev/null
{ grep -E "^(FAILED|ERROR)|passed|failed|rc=" $W/seg-rows.log | cut -c1-250
  for f in $W/q-*.log; do tr '\r' '\n' < $f | grep -E '^\{|rc=' | cut -c1-330; done
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=|speedups" $f; done
} > "$OUT/summary-f.txt" 2>&1
cat "$OUT/summary-f.txt"
