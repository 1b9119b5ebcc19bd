#!/usr/bin/env bash
# session 23 call 1 (H200): owed run 1 - the predict-graph, validation-graph, fast-path and batched-predict
# GPU suites after the NaN-score change (every detection family's predict graph gained one kernel) and
# fast="aot"'s capture test - beside the fast-path contract's unmeasured arms for all twelve detection
# families, one process per family (bf16 first, then fp16-aot, bf16-fast, bf16-aot; picodet-s's fp16
# arms again, their figures predate the NaN change). Correctness only: no figure here is a time.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LIBREYOLO_CACHE_DIR=/tmp/libreyolo-cache TORCHINDUCTOR_COMPILE_THREADS=2
J=/tmp/fastjson; mkdir -p $J
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, torchvision, timm; print(torch.__version__, torchvision.__version__, torch.version.cuda, timm.__version__)"
  python3 -c "from libreyolo.cli import DEMO_DATA; from libreyolo.data.synthetic import make_shapes_dataset as m; print(m(**DEMO_DATA))"
  python3 -c "from libreyolo.data.datasets import resolve_data; print(resolve_data('shapes'))"; } > $OUT/env.txt 2>&1
( timeout 540 python3 -m pytest -m cuda tests/gpu/test_graphs_gpu.py tests/gpu/test_valgraph_gpu.py \
    tests/gpu/test_fastpath_gpu.py tests/gpu/test_batched_predict_gpu.py -q -p no:cacheprovider -rf --tb=short \
    --timeout=300 -n 3 --durations=15 --junitxml=$OUT/gpu-tests.xml > $OUT/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $OUT/gpu-tests.log ) &
ARMS="bf16 fp16-aot bf16-fast bf16-aot"
for spec in yolo9:30 yolox:30 yolo7:30 rtmdet:30 picodet:30 rtdetr:20 rtdetrv2:20 rtdetrv4:20 dfine:20 deim:20 deimv2:20 ec:20; do
  f=${spec%%:*}; e=${spec##*:}; a=$ARMS; [ $f = picodet ] && a="fp16 fp16-fast $ARMS"
  ( OMP_NUM_THREADS=1 timeout 550 python3 scripts/fast_contract.py --families $f --arms $a --epochs $e \
      --out $J/contract-$f.json > $J/contract-$f.log 2>&1; echo "$f rc=$?" >> $J/contract-$f.log ) &
done
wait
tail -n 4 $OUT/gpu-tests.log
grep -h "rc=\|bitwise" $J/contract-*.log
python3 scripts/fast_contract.py --merge benchmarks/results/session21/call2-fast-contract-merged.json $J/contract-*.json \
  --out $J/merged.json --table $J/table.json --markdown $J/merged.md > $J/merge.log 2>&1; echo "merge rc=$?"
cd $J && tar czf $OUT/contract.tgz .
