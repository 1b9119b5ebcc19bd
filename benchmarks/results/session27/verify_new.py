"""The parity protocol (verify_model: two probes, fp32 and autocast, batch 1 and 8, stale-graph
check) for the families and task variants whose graph flags wait for a GPU run, then the end-to-end
check (graph predict == eager predict on the sample image) with the flag forced on in this process
only. One line per model; run on the GPU machine."""
import sys
import time

import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import verify_model

MODELS = [("ec", "s", "pose"), ("rtmdet", "t", "segment"), ("rtdetrv2", "n", "obb"), ("yolo9_p2", "t", None),
          ("yolo9_e2e", "t", None), ("ppyoloe", "s", None), ("yolonas", "s", None), ("yolonas", "n", "pose"),
          ("dfine", "n", "segment"), ("yolonas", "s", "obb"), ("ec", "s", "segment"),
          ("yolo2", "t", None), ("yolo2", "b", None), ("yolo3", "t", None), ("yolo3", "b", None),
          ("yolo3", "spp", None), ("yolo4", "t", None), ("yolo4", "b", None)]
FIELDS = {"pose": ("keypoints", "boxes"), "segment": ("masks", "boxes"), "obb": ("obb",), None: ("boxes",)}

ONLY = sys.argv[1:]   # names (ec-s-pose, yolonas-s, ...) to run; none: every model
for family, size, task in MODELS:
    if ONLY and f"{family}-{size}" + (f"-{task}" if task else "") not in ONLY:
        continue
    t0 = time.perf_counter()
    name = f"{family}-{size}" + (f"-{task}" if task else "")
    try:
        kw = {"task": task} if task else {}
        m = LibreYOLO.new(family, size, device="cuda", seed=0, **kw)
        # this process only: capture refuses an unflagged family, and the model's graph runner was
        # built with the flag it had then
        type(m).SUPPORTS_CUDA_GRAPH = True
        m.runner.supported = True
        rs = verify_model(m, imgsz=640, batches=(1, 8))
        bad = [str(r) for r in rs if not r.passed]
        a = m([SAMPLE_IMAGE], conf=0.0)[0]
        b = m([SAMPLE_IMAGE], conf=0.0, cuda_graph=True)[0]
        c = m([SAMPLE_IMAGE], conf=0.0, cuda_graph=True)[0]   # a replay
        e2e = all(torch.equal(getattr(a, f).data, getattr(x, f).data) for f in FIELDS[task] for x in (b, c))
        print(f"{name}: verify {len(rs) - len(bad)}/{len(rs)} passed; e2e graph==eager {e2e}; "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        for line in bad:
            print("   FAILED", line, flush=True)
    except Exception as exc:   # one model's failure must not hide the others'
        print(f"{name}: ERROR {type(exc).__name__}: {exc}"[:600], flush=True)
        import traceback
        print("".join(traceback.format_exc().splitlines(True)[-24:]), flush=True)
