#!/usr/bin/env bash
# session 21 call 4: issue 16's 20-epoch run on the bigger built-in set (2,000 + 200 at 640, trained at 320), graph then eager
set -uo pipefail
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 LIBREYOLO_DATASETS_DIR=/tmp/ds
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
J=/tmp/c4; mkdir -p $J
T0=$(date +%s)
python3 -c "from libreyolo.data.synthetic import make_shapes_dataset as m; print(m(n_train=2000, n_val=200, imgsz=640))" > $J/gen.log 2>&1
echo "gen $(( $(date +%s) - T0 )) s" >> $J/gen.log
for spec in graph:150 eager:420; do
  arm=${spec%%:*}; t=${spec##*:}
  timeout $t python3 benchmarks/train_epochs.py --arm $arm --epochs 20 --imgsz 320 --batch 16 --workers 8 --amp true \
    --n-train 2000 > $J/big-$arm.json 2> $J/big-$arm.log; echo "big $arm rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $J/big-$arm.log
  python3 -c "
import json
try: d = json.loads(open('$J/big-$arm.json').read().strip().splitlines()[-1])
except Exception as e: print('$arm: no result', e); raise SystemExit
print('$arm', {k: d.get(k) for k in ('wall_s', 'train_s', 'map50_95', 'map50', 'cuda_graph')})"
done
tail -3 $J/gen.log; cd $J && tar czf $OUT/c4.tgz .
