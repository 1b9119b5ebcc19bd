#!/usr/bin/env bash
# Session 32, call I (carry .whl .whlhf): why the set-image prompt rows of SAM and the padded-prompt
# rows of SAM / EdgeTAM failed in call H (its archive did not come back), and EdgeTAM's parity in
# bfloat16 autocast (its float16 outputs hold NaN, so float16 replays cannot compare equal).
set -uo pipefail
export OUT="${OUT:-.out}"; W=/tmp/work; mkdir -p "$OUT" $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whlhf/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
( timeout 150 python3 - > $W/edgetam-bf16.log 2>&1 <<'PY'
import torch
from libreyolo import LibreYOLO
from libreyolo.engine.verify import verify_model
m = LibreYOLO.new("edgetam", "edge", device="cuda", seed=0)
m.SUPPORTS_CUDA_GRAPH = True
m.runner.supported = True
x = torch.rand(1, 3, 1024, 1024, device="cuda")
for dt in (torch.float16, torch.bfloat16):
    with torch.no_grad(), torch.autocast("cuda", dt):
        out = m.infer(x)
    outs = out if isinstance(out, (list, tuple)) else [out]
    print(dt, "eager outputs non-finite:", [int((~torch.isfinite(o.float())).sum()) for o in outs if torch.is_tensor(o)], flush=True)
for r in verify_model(m, imgsz=1024, batches=(1,), amp_dtypes=(torch.bfloat16,)):
    print({k: v for k, v in r.as_dict().items() if k != "error"}, (r.error or "")[:300], flush=True)
PY
echo "edgetam bf16 rc=$?" >> $W/edgetam-bf16.log ) &
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -n 4 --timeout 180 --tb=short -q -rfEsxX \
  tests/gpu/test_segment_prompt_gpu.py -k "sam-base or edgetam" > $W/prompt.log 2>&1
echo "prompt rc=$?" >> $W/prompt.log
wait
cp $W/prompt.log $W/edgetam-bf16.log "$OUT/"
grep -E "^E |Error|assert|FAILED|passed|failed|rc=" $W/prompt.log | cut -c1-300 | head -60; cat $W/edgetam-bf16.log | cut -c1-400
