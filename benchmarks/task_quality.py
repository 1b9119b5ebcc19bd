"""A user's quality check of the task variants: train a fresh model on its task's built-in set for
N epochs and report the validation metrics of the best weights (one JSON line per model).

    PYTHONPATH=. python3 benchmarks/task_quality.py --models yolonas-n-pose rtmdet-t-segment \
        --epochs 30 --imgsz 320 --json quality.json

Each model is ``LibreYOLO.new(family, size, task=...)`` trained with the family's own defaults
(optimizer, learning rate, augmentation) apart from the options given here, on the built-in set
of its task (``shapes-inst``, ``shapes-pose``, ``shapes-obb``), then validated from ``best.pt``.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from libreyolo import LibreYOLO

DATA = {"segment": "shapes-inst", "pose": "shapes-pose", "obb": "shapes-obb", "detect": "shapes"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True, help="family-size-task names, e.g. rtmdet-t-segment")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cuda-graph", action="store_true", help="train with the captured step where declared")
    ap.add_argument("--amp", default=None, choices=("true", "false", "fp16", "bf16"),
                    help="the trainer's autocast (default: its own, float16 with a GradScaler on CUDA)")
    ap.add_argument("--seed", type=int, default=0, help="the initial weights', data order's and augmentation's "
                                                        "seed (runs of one recipe spread: compare several)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", default=None, help="a folder: each trained model saved there as <name>.pt "
                                                  "(for benchmarks on trained weights)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more training options (e.g. lr0=0.004 warmup_epochs=1), parsed as YAML scalars")
    args = ap.parse_args()
    import yaml
    extra = {}
    for kv in args.set:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--set takes KEY=VALUE, got {kv!r}")
        extra[key] = yaml.safe_load(value)
    rows = []
    with tempfile.TemporaryDirectory(prefix="task-quality-") as tmp:
        for name in args.models:
            family, size, *task = name.split("-")
            task = task[0] if task else "detect"
            model = LibreYOLO.new(family, size, task=task, device=args.device, seed=args.seed)
            t0 = time.perf_counter()
            res = model.train(data=DATA[task], epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                              project=str(Path(tmp) / name), seed=args.seed, cuda_graph=args.cuda_graph, verbose=False,
                              **({} if args.amp is None else {"amp": args.amp}), **extra)
            train_s = time.perf_counter() - t0
            val = model.val(data=DATA[task], imgsz=args.imgsz, batch=args.batch)
            history = res.get("history", []) if isinstance(res, dict) else []
            row = {"model": name, "amp": args.amp or "default", "set": extra, "seed": args.seed, "epochs": args.epochs, "imgsz": args.imgsz, "batch": args.batch,
                   "train_s": round(train_s, 1), "ckpt": Path(model.ckpt_path or "").name,
                   "val_best": {k: round(float(v), 4) for k, v in val.items() if isinstance(v, (int, float))},
                   "cuda_graph": res.get("cuda_graph") if isinstance(res, dict) else None,
                   # each epoch's validation mAP50 figures: still rising at the end, or level
                   "curve": {k: [round(float(h[k]), 4) for h in history if k in h]
                             for k in sorted({k for h in history for k in h if k.endswith("map50") and "/" not in k})}}
            rows.append(row)
            if args.keep:
                Path(args.keep).mkdir(parents=True, exist_ok=True)
                model.save(str(Path(args.keep) / f"{name}.pt"))
            print(json.dumps(row, default=str), flush=True)
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor(),
           "torch": torch.__version__, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
