#!/usr/bin/env bash
# One call on a two-GPU machine (device kind nvidia-h200-x2), everything written straight into
# $OUT as it is produced (JSON bundled into $OUT/json.tgz after every step):
#   GPU 0: the whole GPU test suite (tests/gpu: inference graphs + training capture, every row)
#   GPU 1: benchmarks and the per-family parity runs still pending (docs/families.md,
#          "Not yet"): the D-FINE line's parity + bench, the DETR seam train step at batch
#          2, 4, 8, yolo7 train-step arms, yolo9t predict for reference.
# Session 2 ran it (run 7) with the lists of that day; edit the lists to what is pending.
set -uo pipefail
J=/tmp/json; mkdir -p "$J"          # JSON results, bundled into $OUT/json.tgz after every step
pack() { tar czf "$OUT/json.tgz" -C "$J" . 2>/dev/null; }
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 -c "import torch;print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))" > "$OUT/env.txt" 2>&1
(
  CUDA_VISIBLE_DEVICES=0 timeout "${T0:-400}" python3 -m pytest -m cuda tests/gpu -q -p no:cacheprovider -rf \
    --tb=short --timeout=120 --durations=15 --junitxml="$J/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
  echo "tests rc=$?" >> "$OUT/gpu-tests.log"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  bench() {  # model [fuse=true]
    timeout 50 python3 -m libreyolo.cli bench model=$1 imgsz=640 batch=1 runs=150 ${2:-} json="$J/bench-$1-b1${2:+-fused}.json" >> "$OUT/bench.log" 2>&1; pack
  }
  bench yolo9t
  timeout 120 python3 scripts/gpu_families.py dfine:n deim:n rtdetrv4:s deimv2:atto --runs 100 --out "$J/families-detr.json" >> "$OUT/families.log" 2>&1; pack
  for b in 2 4 8; do
    timeout 40 python3 benchmarks/train_step.py --all --model rtdetrr18 --arms eager,seam --batch $b --imgsz 640 --amp --runs 15 --warmup 4 --json "$J/seam-b$b.json" >> "$OUT/seam.log" 2>&1; pack
  done
  timeout 150 python3 scripts/gpu_families.py yolo7:tiny yolo7:b --runs 60 --train --out "$OUT/families-cnn.json" >> "$OUT/families.log" 2>&1; pack
  echo "gpu1 done" >> "$OUT/families.log"
) &
wait
pack
