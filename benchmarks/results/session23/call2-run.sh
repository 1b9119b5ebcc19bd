#!/usr/bin/env bash
# session 23 call 2 (H200), timings, nothing else on the machine: owed run 2 - the fast path's warm
# start (scripts/warm_start_probe.py: torch.compile's inductor cache and the fast="aot" package, a cold
# process then warm ones, and whether the package's kernels replay bitwise inside our CUDA graph) for
# yolox-n and yolo9-t at 640 fp16 - then owed run 5, the 30-epoch CLI (issue 16) in three fresh processes
# after the start-up (lazy imports) and curves-child changes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), \
torch._inductor.config.compile_threads, 'compile threads')" > "$OUT/warmstart-env.txt" 2>&1; nproc >> "$OUT/warmstart-env.txt"
probe() {   # model, cache dir, extra args...
  local m=$1 c=$2; shift 2
  OMP_NUM_THREADS=4 timeout 200 python3 scripts/warm_start_probe.py --model "$m" --imgsz 640 --precision fp16 \
    --device cuda --cache "$c" "$@" >> "$OUT/warmstart-$m.jsonl" 2>> "$OUT/warmstart-$m.log"
  echo "$m $* rc=$?" >> "$OUT/warmstart-$m.log"
}
for m in yoloxn yolo9t; do
  c=$(mktemp -d /tmp/libreyolo-warm-XXXX)
  probe "$m" "$c" --arm aoti --cold 1 --warm 2
  probe "$m" "$c" --arm compile --cold 1 --warm 2
done
CLI_ARMS="plain plain plain" T_CLI=100 PART=cli bash scripts/gpu-session.sh
grep -h "rc=" $OUT/warmstart-*.log
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob('/'.join([__import__('os').environ['OUT'], 'warmstart-*.jsonl']))):
    for line in open(f):
        try: r = json.loads(line)
        except ValueError: continue
        print(f.split('/')[-1], {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()
              if k in ('arm', 'kind', 'cold', 'first_result_s', 'first_call_s', 'capture_s', 'graph_bitwise_equal_direct',
                       'capture_error', 'bitwise_equal_previous')})
PY
