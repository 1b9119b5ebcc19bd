"""The accuracy effect of sliced inference (``tiling=True``) and test-time augmentation
(``augment=True``) on the built-in small-object set, against plain predict; one JSON line.

    PYTHONPATH=. python3 benchmarks/tiling_tta.py --model yolo9-t --epochs 12 --imgsz 256 \
        --canvas 1024 --json tiling_tta.json

A fresh model is trained briefly on the ``small`` style of the shapes set
(:data:`libreyolo.data.synthetic.SHAPES_STYLES`: 6 to 32 px shapes) at ``--imgsz`` - canvases of
that size, so it learns the objects at their own scale - with ``libreyolo demo``'s CPU recipe
(AdamW at 0.002, a batch per update, mosaic closed for the last third), unless ``--weights``
names a checkpoint (``--save-weights`` keeps the trained one for a rerun). It is then evaluated on held-out large
canvases of the same style (``--canvas``, e.g. 1024: the objects are a few pixels once the image
is shrunk to ``--imgsz``), each arm a plain ``model.predict`` call over the images:

* ``plain``: predict at ``--imgsz`` (the whole canvas shrunk);
* ``tiled``: ``tiling=True``, tiles of ``--imgsz`` px (overlap 0.2, the full pass, IoS merge),
  and the variants ``tiled_iou`` (IoU merge) and ``tiled_nofull`` (no full pass);
* ``tta``: ``augment=True`` at ``--imgsz``;
* ``plain_canvas``: predict at the canvas's own size (one pass at full resolution: what tiling
  approximates with fixed-size inputs), and ``tta_canvas``: ``augment=True`` there.

Each arm reports COCO mAP50 / mAP50-95 (``libreyolo.tasks.detect.metrics.evaluate_detections``,
at ``conf=0.001`` as validation does) and the wall time per image. Nothing is tuned on the
evaluation images.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import SHAPE_NAMES, make_shapes_dataset
from libreyolo.tasks.detect.metrics import evaluate_detections


def labels_px(label: Path, w: int, h: int) -> np.ndarray:
    """A YOLO label file -> (m, 5) ``[cls, x1, y1, x2, y2]`` in pixels."""
    rows = np.loadtxt(label, ndmin=2, dtype=np.float64) if label.stat().st_size else np.zeros((0, 5))
    c, cx, cy, bw, bh = rows.T
    return np.stack([c, (cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h], 1)


def cpu_name() -> str:
    """The CPU's model name and core count (Linux), else the machine type."""
    try:
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0]} x{len(names)}" if names else platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="yolo9-t", help="family-size of the model trained (e.g. yolo9-t, yolox-n)")
    ap.add_argument("--weights", default=None, help="a checkpoint trained on the small set: no training")
    ap.add_argument("--save-weights", default=None, help="where to keep the trained checkpoint")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--imgsz", type=int, default=256, help="training size, inference size and tile size")
    ap.add_argument("--batch", type=int, default=8, help="training batch")
    ap.add_argument("--n-train", type=int, default=320)
    ap.add_argument("--n-val", type=int, default=32, help="evaluation canvases")
    ap.add_argument("--canvas", type=int, default=1024, help="the evaluation canvases' long side")
    ap.add_argument("--overlap", type=float, default=0.2)
    ap.add_argument("--arms", nargs="+", default=["plain", "tiled", "tiled_iou", "tiled_nofull", "tta",
                                                   "plain_canvas", "tta_canvas"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    train_yaml = make_shapes_dataset(n_train=args.n_train, n_val=16, imgsz=args.imgsz, style="small")
    val_root = Path(make_shapes_dataset(n_train=1, n_val=args.n_val, imgsz=args.canvas, style="small")).parent
    train_s = None
    if args.weights:
        model = LibreYOLO(args.weights, device=args.device)
    else:
        family, size = args.model.split("-")
        model = LibreYOLO.new(family, size, nc=len(SHAPE_NAMES), device=args.device, seed=0)
        with tempfile.TemporaryDirectory(prefix="tiling-tta-") as tmp:
            t0 = time.perf_counter()
            model.train(data=str(train_yaml), epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                        optimizer="AdamW", lr0=0.002, nbs=args.batch, warmup_epochs=min(1.0, args.epochs / 3),
                        close_mosaic=max(1, args.epochs // 3), project=tmp, verbose=False)
            train_s = round(time.perf_counter() - t0, 1)
            model = LibreYOLO(model.ckpt_path, device=args.device)   # the run's best.pt
            if args.save_weights:
                model.save(args.save_weights)

    from PIL import Image
    images = sorted((val_root / "images" / "val").iterdir())
    gts = []
    for p in images:
        with Image.open(p) as im:
            w, h = im.size
        gts.append(labels_px(val_root / "labels" / "val" / (p.stem + ".txt"), w, h))
    n_objects = int(sum(len(g) for g in gts))
    sides = [float(s) for g in gts for s in np.minimum(g[:, 3] - g[:, 1], g[:, 4] - g[:, 2])]

    s = args.imgsz
    arms = {"plain": dict(imgsz=s), "tiled": dict(imgsz=s, tiling=True, overlap_ratio=args.overlap),
            "tiled_iou": dict(imgsz=s, tiling=True, overlap_ratio=args.overlap, tile_merge="iou"),
            "tiled_nofull": dict(imgsz=s, tiling=True, overlap_ratio=args.overlap, tile_full=False),
            "tta": dict(imgsz=s, augment=True), "plain_canvas": dict(imgsz=args.canvas),
            "tta_canvas": dict(imgsz=args.canvas, augment=True)}
    rows = {}
    for name in args.arms:
        opts = arms[name]
        files = [str(p) for p in images]
        model(files[:1], conf=0.001, **opts)   # warm-up: first-call costs out of the timing
        t0 = time.perf_counter()
        results = model(files, conf=0.001, **opts)
        ms = (time.perf_counter() - t0) * 1e3 / len(files)
        preds = [r.boxes.data.numpy() for r in results]
        m = evaluate_detections(preds, gts, len(SHAPE_NAMES))
        rows[name] = {"map50": round(m["map50"], 4), "map50_95": round(m["map50_95"], 4), "ms_per_image": round(ms, 1),
                      "options": opts}
        print(name, json.dumps(rows[name]), file=sys.stderr, flush=True)
    out = {"bench": "tiling_tta", "model": args.model if not args.weights else Path(args.weights).name,
           "epochs": None if args.weights else args.epochs, "train_s": train_s, "imgsz": s, "canvas": args.canvas,
           "n_val": len(images), "objects": n_objects, "object_side_px": [round(min(sides), 1), round(float(np.median(sides)), 1),
                                                                          round(max(sides), 1)],
           "arms": rows, "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else cpu_name(),
           "threads": torch.get_num_threads(), "load_avg_1min_end": round(os.getloadavg()[0], 2),
           "torch": torch.__version__}
    print(json.dumps(out), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
