#!/usr/bin/env bash
# The fast path's warm start on the GPU (issue 15: a second process's first fast result <= 5 s),
# one call, alone on the machine (the figures are wall-clock seconds of fresh processes). Per model
# in $MODELS, over a fresh LIBREYOLO_CACHE_DIR each, scripts/warm_start_probe.py writes one JSON
# line per process into $OUT/warmstart-<model>.jsonl:
#   - arm "compile" (the fast path as it is: torch.compile of the half network, inductor's caches
#     in <cache>/inductor/torch-<version>): 1 cold process (the first compile), $WARM warm ones
#     (the cache hit: fxgraph_cache_hit / autograd_cache_hit counters, bitwise equal output), one
#     more warm one with TORCHINDUCTOR_COMPILE_THREADS=1 (no compile-worker pool started);
#   - arm "aoti" (AOTInductor package of the same network, no dynamo in the warm process): 1 cold
#     process (export + compile + package), $WARM warm ones (load + run);
#   each with per-phase seconds (import torch / libreyolo, model build, half copy or package load,
#   first call, dynamo's own phases), the capture of the network inside our CUDA graph
#   (capture_s) and whether that graph's replay is bitwise equal to the network called directly.
# Then the CPU tests of the cache mechanics (tests/unit/test_fastpath.py, the slow one included).
# Environment: MODELS (default "yoloxn yolo9t"), IMGSZ (640), PRECISION (fp16), WARM (2). Two models
# may pass the device's 10-minute limit per call: then one call per model (MODELS=yoloxn, ...).
set -uo pipefail
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), \
torch._inductor.config.compile_threads, 'compile threads')" > "$OUT/warmstart-env.txt" 2>&1
nproc >> "$OUT/warmstart-env.txt"
probe() {   # model, cache dir, extra args...
  local m=$1 c=$2; shift 2
  timeout 280 python3 scripts/warm_start_probe.py --model "$m" --imgsz "${IMGSZ:-640}" \
    --precision "${PRECISION:-fp16}" --device cuda --cache "$c" "$@" >> "$OUT/warmstart-$m.jsonl" \
    2>> "$OUT/warmstart-$m.log"
  echo "$m $* rc=$?" >> "$OUT/warmstart-$m.log"
}
for m in ${MODELS:-yoloxn yolo9t}; do
  c=$(mktemp -d /tmp/libreyolo-warm-XXXX)
  probe "$m" "$c" --arm compile --cold 1 --warm "${WARM:-2}"
  export TORCHINDUCTOR_COMPILE_THREADS=1; probe "$m" "$c" --arm compile --cold 0 --warm 1
  unset TORCHINDUCTOR_COMPILE_THREADS
  probe "$m" "$c" --arm aoti --cold 1 --warm "${WARM:-2}"
  du -sh "$c"/* >> "$OUT/warmstart-$m.log" 2>&1
done
# the CPU test of the same mechanics (two processes, one cache dir: hit and bitwise equal output)
LIBREYOLO_SLOW=1 OMP_NUM_THREADS=1 timeout 200 python3 -m pytest tests/unit/test_fastpath.py -q -p no:cacheprovider \
  -k "hits_the_cache or one_family or inductor_cache_dir" > "$OUT/warmstart-unit-tests.log" 2>&1
ls -la "$OUT" > "$OUT/warmstart-manifest.txt"
