#!/usr/bin/env bash
# Session 34, call E (carry .whl; the fixtures' tensors out of the copy): call D cut to what the
# device time left allows (about 120 s): the fused mask kernel's bits against the tensor way, its
# time against the grid_sample sampling it replaces (alone on the card), the segment / pose
# predict rows.
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work-e; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
timeout -s INT 60 python3 -m pytest -p no:cacheprovider --timeout 55 --tb=short -q -rfEsxX tests/gpu/test_mask_sample_gpu.py \
  > $W/mask-kernel.log 2>&1; echo "mask kernel rc=$?" >> $W/mask-kernel.log
timeout 35 python3 benchmarks/segment_masks.py --device cuda --instances 138 --runs 20 --warmup 3 > $W/masks-138.log 2>&1
echo "masks 138 rc=$?" >> $W/masks-138.log
timeout -s INT 60 python3 -m pytest -p no:cacheprovider -n 4 --timeout 55 --tb=short -q -rfEsxX \
  tests/gpu/test_tasks_gpu.py -k "(predict_with_graph or select_in_the_stage) and (seg or pose)" > $W/seg-rows.log 2>&1
echo "seg rows rc=$?" >> $W/seg-rows.log
tar czf "$OUT/all-e.tgz" -C $W . 2>/dev/null
{ grep -E "^(FAILED|ERROR)|passed|failed|rc=" $W/mask-kernel.log $W/seg-rows.log | cut -c1-250
  cat $W/masks-138.log; } > "$OUT/summary-e.txt" 2>&1
cat "$OUT/summary-e.txt"
