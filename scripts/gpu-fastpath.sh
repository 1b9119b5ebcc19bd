#!/usr/bin/env bash
# The fast path's GPU run (issue 15), one call: every figure and proof it needs, written into $OUT.
#   - scripts/fast_contract.py per detection family, the families spread over the machine's GPUs
#     (one process per family: its own dynamo/inductor state), merged into
#     $OUT/fast_contract.json (raw), $OUT/fast_contract.table.json (the file to copy to
#     libreyolo/assets/fast_contract.json) and $OUT/fast_contract.md (for docs/families.md);
#   - `libreyolo bench` with the compile arms (reduce-overhead, half, fast; first-compile and
#     second-process warm-start times) for the models in $BENCH, on a GPU of its own when the
#     machine has two or more (the last one);
#   - the fast path's unit tests on this machine (tests/unit/test_fastpath.py).
# Environment: FAMILIES (default all twelve), PRECISIONS (default fp16), EPOCHS (default: 30 for the
# YOLO-style families, 20 for the DETRs, the training the shipped table was measured on), BENCH
# (default yoloxn yolo9t dfinen rtdetrr18), BENCH_MODES (compile modes benched, default "default"),
# T_FAM (seconds per family, default 300), RUNS (bench runs, default 100), SIDE_BY_SIDE=1 (every
# family its own process at once, dealt over the GPUs: twelve families fit one 600 s call on one
# H200, where one after the other they do not), MERGE_WITH (earlier raw files the new figures are
# merged onto, a family's arms kept unless measured again; default the shipped table's raw file),
# FAST_MODES (the arms per precision, default "false true"; "aot" adds the ahead-of-time arm,
# e.g. FAST_MODES=aot alone to measure only that arm, merged onto the shipped ones).
set -uo pipefail
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
# inductor's caches: the second bench process's warm start reads what the first wrote
export LIBREYOLO_CACHE_DIR="${LIBREYOLO_CACHE_DIR:-/tmp/libreyolo-cache}"
J=/tmp/fastjson; mkdir -p "$J"
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), '$NGPU GPU(s)')" > "$OUT/env.txt" 2>&1
# the shapes set once, before the parallel processes read it
python3 -c "from libreyolo.data.datasets import resolve_data; resolve_data('shapes')" >> "$OUT/env.txt" 2>&1
FAMS=(${FAMILIES:-yolo9 yolox yolo7 rtmdet picodet rtdetr rtdetrv2 rtdetrv4 dfine deim deimv2 ec})
NFAM=$NGPU; [ "$NGPU" -ge 2 ] && NFAM=$((NGPU - 1))   # the last GPU benches
bench() {
  for mode in ${BENCH_MODES:-default}; do
    for m in ${BENCH:-yoloxn yolo9t dfinen rtdetrr18}; do
      timeout 300 python3 -m libreyolo.cli bench model="$m" runs="${RUNS:-100}" warmup=20 compile_mode="$mode" \
        json="$J/bench-$m-$mode.json" >> "$OUT/bench.log" 2>&1
      echo "$m $mode rc=$?" >> "$OUT/bench.log"
    done
  done
}
epochs_of() {   # the training the shipped figures were measured on
  case "$1" in rtdetr*|dfine|deim*|ec) echo "${EPOCHS:-20}";; *) echo "${EPOCHS:-30}";; esac
}
contract() {   # one family, its own process
  timeout "${T_FAM:-300}" python3 scripts/fast_contract.py --families "$1" --precisions ${PRECISIONS:-fp16} \
    --fast-modes ${FAST_MODES:-false true} \
    --epochs "$(epochs_of "$1")" --out "$J/contract-$1.json" >> "$OUT/contract-$1.log" 2>&1
  echo "$1 rc=$?" >> "$OUT/contract-$1.log"
}
if [ "${SIDE_BY_SIDE:-0}" = 1 ]; then
  for ((i = 0; i < ${#FAMS[@]}; i++)); do
    (export CUDA_VISIBLE_DEVICES=$((i % NFAM)) OMP_NUM_THREADS=2; contract "${FAMS[$i]}") &
  done
  [ "$NGPU" -lt 2 ] && BENCH_AFTER=1   # after the contracts (below): not beside them on the one GPU
else
  for ((g = 0; g < NFAM; g++)); do
    (
      export CUDA_VISIBLE_DEVICES=$g
      for ((i = g; i < ${#FAMS[@]}; i += NFAM)); do contract "${FAMS[$i]}"; done
      [ "$NGPU" -lt 2 ] && bench
    ) &
  done
fi
if [ "$NGPU" -ge 2 ]; then (export CUDA_VISIBLE_DEVICES=$((NGPU - 1)); bench) & fi
OMP_NUM_THREADS=1 timeout 200 python3 -m pytest tests/unit/test_fastpath.py -q -p no:cacheprovider > "$OUT/unit-tests.log" 2>&1 &
wait
[ "${BENCH_AFTER:-0}" = 1 ] && bench
python3 scripts/fast_contract.py --merge ${MERGE_WITH:-benchmarks/results/session21/call2-fast-contract-merged.json} \
  "$J"/contract-*.json --out "$OUT/fast_contract.json" \
  --table "$OUT/fast_contract.table.json" --markdown "$OUT/fast_contract.md" > "$OUT/merge.log" 2>&1
cp "$J"/bench-*.json "$OUT/" 2>/dev/null
ls -la "$OUT" > "$OUT/manifest.txt"
