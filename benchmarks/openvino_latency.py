"""CPU predict latency of one model three ways, in one process: eager PyTorch, onnxruntime
(:class:`~libreyolo.export.onnx_model.OnnxModel`) and OpenVINO (:class:`~libreyolo.export.openvino_model.OpenvinoModel`).

The model (default yolo9-t) is exported at ``--imgsz`` (default 640, batch 1, fp32) to ONNX and to
OpenVINO; the three engines then predict the sample photo in turn - eager, onnxruntime, OpenVINO,
repeated ``--runs`` times, alternating so that the machine's other load falls on all three alike -
after ``--warmup`` untimed calls each. Recorded per engine: the median (and min, max) of the whole
``predict`` call in ms, the median of its ``inference`` stage, and the detection count (which must
agree). All engines use ``--threads`` CPU threads (torch's, onnxruntime's intra-op, OpenVINO's
inference threads). Weights: ``--weights`` (a checkpoint), else the fixtures' deterministic fill
of the model's layout (tests/export_parity.py; dense detections, so NMS has real work).

    PYTHONPATH=.:tests:/work/shared/fixtures OMP_NUM_THREADS=1 python benchmarks/openvino_latency.py \\
        --threads 1 --runs 30 --json benchmarks/results/openvino/yolo9t-640-cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _model(family: str, size: str, imgsz: int, weights: str | None):
    from libreyolo import LibreYOLO
    if weights:
        return LibreYOLO(weights, device="cpu")
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "fixtures")]
    from export_parity import filled_model
    return filled_model(family, size, imgsz)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="yolo9-t", help="family-size (default yolo9-t)")
    ap.add_argument("--weights", default=None, help="a checkpoint (default: the fixtures' fill weights)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    import numpy as np
    import onnxruntime
    import openvino
    import torch
    from PIL import Image

    from libreyolo import SAMPLE_IMAGE
    from libreyolo.export.onnx_model import OnnxModel
    from libreyolo.export.openvino_model import OpenvinoModel

    torch.set_num_threads(args.threads)
    family, size = args.model.rsplit("-", 1)
    model = _model(family, size, args.imgsz, args.weights)
    image = np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB"))
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = model.export(format="onnx", file=Path(tmp) / "m.onnx", imgsz=args.imgsz)
        ov_dir = model.export(format="openvino", file=Path(tmp) / "m_openvino_model", imgsz=args.imgsz)
        engines = {"eager": model,
                   "onnxruntime": OnnxModel(onnx_path, device="cpu", threads=args.threads),
                   "openvino": OpenvinoModel(ov_dir, device="cpu", threads=args.threads)}
        opts = {"imgsz": args.imgsz, "conf": args.conf}
        for e in engines.values():
            for _ in range(args.warmup):
                e.predict(image, **opts)
        calls = {k: [] for k in engines}
        infer = {k: [] for k in engines}
        counts = {k: set() for k in engines}
        load = [os.getloadavg()[0]]
        for _ in range(args.runs):
            for name, e in engines.items():
                t0 = time.perf_counter()
                r = e.predict(image, **opts)
                calls[name].append((time.perf_counter() - t0) * 1e3)
                infer[name].append(r.speed["inference"])
                counts[name].add(len(r.boxes))
            load.append(os.getloadavg()[0])
    out = {"model": args.model, "weights": args.weights or "fixture fill (tests/export_parity.py filled_model)",
           "imgsz": args.imgsz, "batch": 1, "threads": args.threads, "runs": args.runs, "warmup": args.warmup,
           "conf": args.conf, "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
           "openvino": openvino.get_version(), "cpu": _cpu_name(),
           "cpu_count": os.cpu_count(), "load_avg_1min": {"min": min(load), "max": max(load)},
           "date": time.strftime("%Y-%m-%d"), "engines": {}}
    base = statistics.median(calls["eager"])
    for name in engines:
        med = statistics.median(calls[name])
        out["engines"][name] = {"predict_ms_median": round(med, 2), "predict_ms_min": round(min(calls[name]), 2),
                                "predict_ms_max": round(max(calls[name]), 2),
                                "inference_ms_median": round(statistics.median(infer[name]), 2),
                                "detections": sorted(counts[name]), "speedup_vs_eager": round(base / med, 3)}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
