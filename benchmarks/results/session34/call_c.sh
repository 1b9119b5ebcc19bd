#!/usr/bin/env bash
# Session 34, call C (carry .whl; the fixtures' tensors out of the copy): YOLO-NAS-Pose's quality
# check (30 epochs at 320, batch 16, fp32) over seeds, all runs side by side on the card: runs of
# one recipe spread by +-0.15 OKS mAP50, so each recipe gets several seeds. Arms: the defaults
# (lr0 2e-3), lr0 1e-3, lr0 5e-4 (captured step), and the keypoint terms ramped in over the first
# 120 steps with lr0 1e-3 (pose_kpt_ramp.py; eager: its ramp is a Python float).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
# the set generated once before the runs start
python3 -c "from libreyolo.tasks.pose.synthetic import make_shapes_pose_dataset as m; m()" > /dev/null 2>&1
Q="--models yolonas-n-pose --epochs 30 --imgsz 320 --batch 16 --amp false"
run() { local name=$1; shift; ( timeout 420 "$@" --json $W/q-$name.json > $W/q-$name.log 2>&1; echo "$name rc=$?" >> $W/q-$name.log ) & }
for s in 1 2; do run def-s$s python3 benchmarks/task_quality.py $Q --cuda-graph --seed $s; done
for s in 0 1 2; do run lr1e-3-s$s python3 benchmarks/task_quality.py $Q --cuda-graph --seed $s --set lr0=0.001; done
for s in 1 2; do run lr5e-4-s$s python3 benchmarks/task_quality.py $Q --cuda-graph --seed $s --set lr0=0.0005; done
for s in 0 1 2; do run ramp-s$s env PR_STEPS=120 python3 benchmarks/results/session34/pose_kpt_ramp.py $Q --seed $s --set lr0=0.001; done
wait
tar czf "$OUT/all-c.tgz" -C $W . 2>/dev/null
for f in $W/q-*.log; do tr '\r' '\n' < $f | grep -E '^\{|rc=' | python3 -c "
import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith('{'):
        r=json.loads(l); v=r['val_best']; print(r['set'], 'seed', r['seed'], 'oks50', v.get('oks_map50'), 'box50', v.get('map50'), 'train_s', r['train_s'])
    else: print(l)"; done > "$OUT/summary-c.txt" 2>&1
cat "$OUT/summary-c.txt"
