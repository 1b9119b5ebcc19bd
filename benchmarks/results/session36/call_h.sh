#!/usr/bin/env bash
# Session 36, call H (carry .whl; H200): session 35's call G less its bf16 step row (a shorter lease).
# RTMDet-Ins / YOLO-NAS-Pose trained 10 epochs (weights kept,
# for timing only), then, each alone on the card: the mask kernel's tiles and the post-processing's
# profile (session36/seg_post.py: the windowed launch beside it), `libreyolo bench` on both, the classifiers' latency; tiled predict's GPU test and the
# segment predict rows with the cached axis tables and the mask logits in batches of 128; the
# fused (BatchNorm-folded) classifiers' parity and latency; YOLO-NAS-Pose's visibility init, fp32 seeds 0-2.
set -uo pipefail
export OUT="${OUT:-.out}"; W=$OUT/h; mkdir -p "$OUT" $W/keep /tmp/keep-h
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
python3 -c "from libreyolo.tasks.segment.data import make_shapes_inst_dataset as m; m()" > /dev/null 2>&1 &
python3 -c "from libreyolo.tasks.pose.synthetic import make_shapes_pose_dataset as m; m()" > /dev/null 2>&1 &
wait
# PROOF=1 (a very short lease): no training, the GPU tests and the kernel's timing alone
if [ -z "${PROOF:-}" ]; then
for m in rtmdet-t-segment yolonas-n-pose; do
  ( timeout 70 python3 benchmarks/task_quality.py --models $m --epochs 10 --imgsz 320 --batch 16 --cuda-graph \
      --keep /tmp/keep-h --json $W/q-$m.json > $W/q-$m.log 2>&1; echo "train $m rc=$?" >> $W/q-$m.log ) &
done
# YOLO-NAS-Pose's visibility init (session 35): fp32 seeds 0-2 at 320, against session 34's 0.481 / 0.448 / 0.200
for s in 0 1 2; do ( timeout 150 python3 benchmarks/task_quality.py --models yolonas-n-pose --epochs 30 --imgsz 320 --batch 16 \
    --cuda-graph --amp false --seed $s --json $W/q-pose-fp32-s$s.json > $W/q-pose-fp32-s$s.log 2>&1; echo "pose fp32 s$s rc=$?" >> $W/q-pose-fp32-s$s.log ) & done
# the keypoint branch's gradient scaled by 0.25 (session 36's kpt_grad; CPU at 160 px: better on each of 6 seeds):
# fp32 and the default float16 autocast, seeds 0-2, to set it as the family's default
for s in 0 1 2; do for a in false default; do ( timeout 200 python3 benchmarks/task_quality.py --models yolonas-n-pose --epochs 30 \
    --imgsz 320 --batch 16 --cuda-graph $([ $a = false ] && echo --amp false) --seed $s --set kpt_grad=0.25 \
    --json $W/q-kg-$a-s$s.json > $W/q-kg-$a-s$s.log 2>&1; echo "pose kpt_grad 0.25 amp=$a s$s rc=$?" >> $W/q-kg-$a-s$s.log ) & done; done
fi
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -n 3 --timeout 180 --tb=short -q -rfEsxX tests/gpu/test_sliced_gpu.py \
  tests/gpu/test_mask_sample_gpu.py tests/gpu/test_timm_fuse_gpu.py tests/gpu/test_tasks_gpu.py \
  -k "sliced or mask or fuse or (predict_with_graph and seg) or keypoint_gradient" \
  > $W/sliced.log 2>&1; echo "sliced + mask rows rc=$?" >> $W/sliced.log
wait
timeout 90 python3 benchmarks/results/session36/seg_post.py $([ -f /tmp/keep-h/rtmdet-t-segment.pt ] && echo --model /tmp/keep-h/rtmdet-t-segment.pt) > $W/seg-post.log 2>&1
echo "seg post rc=$?" >> $W/seg-post.log
# LEAN=1 (a short lease): RTMDet-Ins's bench alone, no latency rows
for m in /tmp/keep-h/*.pt; do
  [ -f "$m" ] || continue; n=$(basename "$m" .pt)
  [ -n "${LEAN:-}" ] && [ "$n" != rtmdet-t-segment ] && continue
  timeout 45 python3 -m libreyolo.cli bench model="$m" imgsz=640 batch=1 compile=false runs=150 warmup=20 \
    json=$W/bench-$n.json > $W/bench-$n.log 2>&1; echo "bench $n rc=$?" >> $W/bench-$n.log
done
for m in ${LEAN:+none} ${PROOF:+none} "resnet 18"; do [ "$m" = none ] && break; n=${m/ /-}
  timeout 60 python3 scripts/classify_latency.py --model $m --calls 5 --out $W/lat > $W/lat-$n.log 2>&1; echo "latency $n rc=$?" >> $W/lat-$n.log
  timeout 60 python3 scripts/classify_latency.py --model $m --calls 5 --fuse --out $W/lat > $W/lat-$n-fused.log 2>&1
  echo "latency $n fused rc=$?" >> $W/lat-$n-fused.log
done
rm -rf /tmp/keep-h $W/keep $W/lat/*.json.gz
{ grep -h "rc=" $W/q-*.log; for f in $W/q-pose-fp32-s*.log $W/q-kg-*.log; do tr '\r' '\n' < $f | grep -E '^\{' | cut -c1-330; done; grep -E "^(FAILED|ERROR)|passed|failed|rc=" $W/sliced.log | cut -c1-250
  head -c 5000 $W/seg-post.log; grep "rc=" $W/seg-post.log
  for f in $W/bench-*.log; do grep -E "predict\(graph\) /|stages|rc=|speedups" $f; done
  for f in $W/lat-*.log; do grep -E '"e2e_|wall_ms"|rc=' $f | head -8; done
} > "$OUT/summary-h.txt" 2>&1
# everything in one archive: at most 8 files come back
tar czf "$OUT/h.tgz" -C "$OUT" h && rm -rf "$W"
cat "$OUT/summary-h.txt"
