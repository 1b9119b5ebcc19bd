#!/usr/bin/env bash
# One call on a two-GPU machine (device kind nvidia-h200-x2; on one GPU set G1=0), everything written straight into
# $OUT as it is produced (JSON bundled into $OUT/json.tgz after every step):
#   GPU 0: every cuda-marked test (tests/gpu: inference graphs + training capture, every row;
#          tests/unit: per-family loss capture, decoders on the GPU),
#          then parity + bench of the family sizes in $SIZES (none by default).
#   GPU 1: where predict's GPU time goes (scripts/profile_stages.py), `libreyolo bench` for the
#          models in $BENCH, the DETR seam train step at batch 2, 4, 8 for the models in $SEAM;
#          with QUIET_BENCH=1 the benchmarks start only once the test suite has ended; with
#          AB="<ab_predict.py arguments>" (baseline copies carried in .ab) that side-by-side comparison
#          runs first.
# Lists are environment variables so one call can be aimed at what is pending.
set -uo pipefail
rm -f /tmp/tests-done
# Each process keeps to its share of the host's cores: the benchmarks measure host-side costs
# (upload, launch, the DETR step's eager decoder and loss) that oversubscribed OpenMP teams distort.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
J=/tmp/json; mkdir -p "$J"          # JSON results, bundled into $OUT/json.tgz after every step
pack() { tar czf "$OUT/json.tgz" -C "$J" . 2>/dev/null; }
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 -c "import torch;print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))" > "$OUT/env.txt" 2>&1
(
  export CUDA_VISIBLE_DEVICES=0
  timeout "${T0:-380}" python3 -m pytest -m cuda tests -q -p no:cacheprovider -rf \
    --tb=short --timeout=120 --durations=15 --junitxml="$J/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
  echo "tests rc=$?" >> "$OUT/gpu-tests.log"; pack; touch /tmp/tests-done
  if [ -n "${SIZES:-}" ]; then
    timeout "${T0B:-150}" python3 scripts/gpu_families.py $SIZES --runs 100 --out "$J/families-sizes.json" >> "$OUT/families.log" 2>&1; pack
  fi
  echo "gpu0 done" >> "$OUT/families.log"
) &
(
  export CUDA_VISIBLE_DEVICES="${G1:-1}"
  timeout "${TP:-90}" python3 scripts/profile_stages.py ${PROFILE:-yolox:n yolo9:t rtdetr:r18 dfine:n} ${PROFILE_ARGS:-} --out "$J/stages.json" > "$OUT/stages.log" 2>&1; pack
  # QUIET_BENCH=1: the benchmarks wait for the test suite to end (host-bound figures undisturbed)
  if [ -n "${QUIET_BENCH:-}" ]; then while [ ! -e /tmp/tests-done ]; do sleep 2; done; fi
  if [ -n "${AB:-}" ]; then
    PYTHONPATH="$PWD/.ab:$PYTHONPATH" timeout "${TAB:-120}" python3 scripts/ab_predict.py $AB --out "$J/ab.json" > "$OUT/ab.log" 2>&1; pack
  fi
  for m in ${BENCH:-yoloxn yolo9t yolo7tiny rtmdett picodets rtdetrr18 dfinen}; do
    timeout 45 python3 -m libreyolo.cli bench model=$m imgsz=640 batch=1 runs=150 json="$J/bench-$m-b1.json" >> "$OUT/bench.log" 2>&1; pack
  done
  for m in ${SEAM:-dfinen rtdetrr18}; do
    for b in 2 4 8; do
      timeout 40 python3 benchmarks/train_step.py --all --model $m --arms eager,seam --batch $b --imgsz 640 --amp --runs 15 --warmup 4 --json "$J/seam-$m-b$b.json" >> "$OUT/seam.log" 2>&1; pack
    done
  done
  echo "gpu1 done" >> "$OUT/bench.log"
) &
wait
pack
