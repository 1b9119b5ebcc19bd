#!/usr/bin/env bash
# session 21 call 2: the fast-path contract (fp16, fp16-fast) for the eight unmeasured detection families,
# one process per family side by side on the one GPU (YOLOs 30 epochs, DETRs 20, as session 8)
set -uo pipefail
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export LIBREYOLO_CACHE_DIR=/tmp/libreyolo-cache
J=/tmp/fastjson; mkdir -p $J
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" > $J/env.txt 2>&1
python3 -c "
from libreyolo.cli import DEMO_DATA
from libreyolo.data.synthetic import make_shapes_dataset
print(make_shapes_dataset(**DEMO_DATA))" >> $J/env.txt 2>&1
for spec in yolo7:30 rtmdet:30 picodet:30 rtdetrv2:20 rtdetrv4:20 deim:20 deimv2:20 ec:20; do
  f=${spec%%:*}; e=${spec##*:}
  ( timeout 500 python3 scripts/fast_contract.py --families $f --precisions fp16 --epochs $e --out $J/contract-$f.json > $J/contract-$f.log 2>&1
    echo "$f rc=$?" >> $J/contract-$f.log ) &
done
wait
tail -n 3 $J/contract-*.log
grep -h "bitwise" $J/contract-*.log
cd $J && tar czf $OUT/contract.tgz . 
