"""mAP of a detector through eager PyTorch, the OpenVINO float32 IR and the OpenVINO int8 IR (NNCF
post-training quantization), on a dataset's validation split; the int8 calibration on its training
images (docs/benchmarks.md, "OpenVINO int8").

    python scripts/export_int8_accuracy.py --model runs/demo/train/weights/best.pt --data shapes \
        --imgsz 320 --calib 300

Prints one JSON object: per runtime mAP50 and mAP50-95 (COCO, faster-coco-eval), predict at
conf 0.001 / max_det 300 (validation's settings), and the export and evaluation seconds.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def evaluate(model, samples, nc: int, imgsz: int) -> dict:
    from libreyolo.tasks.detect.metrics import evaluate_detections
    preds, gts = [], []
    for s in samples:
        r = model.predict(str(s.image), imgsz=imgsz, conf=0.001, max_det=300)
        b = r.boxes
        preds.append(np.concatenate([b.xyxy.numpy(), b.conf.numpy()[:, None], b.cls.numpy()[:, None]], 1))
        lab = np.asarray(s.labels, np.float64).reshape(-1, 5).copy()
        lab[:, [1, 3]] *= s.width
        lab[:, [2, 4]] *= s.height
        gts.append(lab)
    m = evaluate_detections(preds, gts, nc)
    return {"map50": round(float(m["map50"]), 4), "map50_95": round(float(m["map50_95"]), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default="shapes")
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--calib", type=int, default=300, help="calibration images (NNCF's subset size)")
    ap.add_argument("--val", type=int, default=0, help="validation images to use (0: all)")
    args = ap.parse_args()
    import nncf
    import openvino

    from libreyolo import LibreYOLO, __version__
    from libreyolo.export import openvino as ovx
    ovx.CALIBRATION_IMAGES = args.calib
    m = LibreYOLO(args.model, device="cpu")
    data = m.task_def.resolve_data(args.data)
    val = data.val[:args.val] if args.val else data.val
    out: dict = {"model": args.model, "data": args.data, "imgsz": args.imgsz, "val_images": len(val),
                 "calibration_images": min(args.calib, len(data.train)), "torch": torch.__version__,
                 "openvino": openvino.get_version(), "nncf": nncf.__version__, "libreyolo": __version__,
                 "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                 "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"eager": m}
        for name, kw in (("openvino_fp32", {}), ("openvino_int8", {"int8": True, "data": args.data})):
            t0 = time.perf_counter()
            path = m.export(format="openvino", file=Path(tmp) / f"{name}_openvino_model", imgsz=args.imgsz, **kw)
            out[f"{name}_export_s"] = round(time.perf_counter() - t0, 1)
            runs[name] = LibreYOLO(path)
        for name, model in runs.items():
            t0 = time.perf_counter()
            out[name] = evaluate(model, val, m.nc, args.imgsz)
            out[name]["eval_s"] = round(time.perf_counter() - t0, 1)
    out["delta_map50_95_int8_vs_fp32"] = round(out["openvino_int8"]["map50_95"] - out["openvino_fp32"]["map50_95"], 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
