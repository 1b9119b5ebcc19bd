"""A user's quality check of the task variants: train a fresh model on its task's built-in set for
N epochs and report the validation metrics of the best weights (one JSON line per model).

    PYTHONPATH=. python3 benchmarks/task_quality.py --models yolonas-n-pose rtmdet-t-segment \
        --epochs 30 --imgsz 320 --json quality.json

Each model is ``LibreYOLO.new(family, size, task=...)`` trained with the family's own defaults
(optimizer, learning rate, augmentation) apart from the options given here, on the built-in set
of its task (``shapes-inst``, ``shapes-pose``, ``shapes-obb``), then validated from ``best.pt``.
``--seed 0 1 2`` runs each model once per seed and ends with each model's spread of its task's
figure (mask mAP50, OKS mAP50, mAP50): one run of a 30-epoch recipe says little on its own.
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


#: the figure each task's quality check is judged by
MAIN_METRIC = {"segment": "mask_map50", "pose": "oks_map50", "obb": "map50", "detect": "map50"}


def run_one(name: str, seed: int, args, extra: dict, tmp: Path) -> dict:
    """Train a fresh ``name`` on its built-in set with ``seed``, validate best.pt -> the JSON row."""
    family, size, *rest = name.split("-")
    task = rest[0] if rest else "detect"
    model = LibreYOLO.new(family, size, task=task, device=args.device, seed=seed)
    t0 = time.perf_counter()
    res = model.train(data=DATA[task], epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                      project=str(tmp / f"{name}-{seed}"), seed=seed, cuda_graph=args.cuda_graph, verbose=False,
                      **({} if args.amp is None else {"amp": args.amp}), **extra)
    train_s = time.perf_counter() - t0
    val = model.val(data=DATA[task], imgsz=args.imgsz, batch=args.batch)
    history = res.get("history", []) if isinstance(res, dict) else []
    row = {"model": name, "task": task, "amp": args.amp or "default", "set": extra, "seed": seed,
           "epochs": args.epochs, "imgsz": args.imgsz, "batch": args.batch,
           "train_s": round(train_s, 1), "ckpt": Path(model.ckpt_path or "").name,
           "val_best": {k: round(float(v), 4) for k, v in val.items() if isinstance(v, (int, float))},
           "cuda_graph": res.get("cuda_graph") if isinstance(res, dict) else None,
           # each epoch's validation mAP50 figures: still rising at the end, or level
           "curve": {k: [round(float(h[k]), 4) for h in history if k in h]
                     for k in sorted({k for h in history for k in h if k.endswith("map50") and "/" not in k})}}
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        suffix = "" if len(args.seed) == 1 else f"-seed{seed}"
        model.save(str(Path(args.keep) / f"{name}{suffix}.pt"))
    return row


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
    ap.add_argument("--seed", type=int, nargs="+", default=[0],
                    help="the initial weights', data order's and augmentation's seed; several: one run each, "
                         "then each model's spread (runs of one recipe differ by up to 0.3 mAP50: compare several)")
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
            for seed in args.seed:
                rows.append(run_one(name, seed, args, extra, Path(tmp)))
                print(json.dumps(rows[-1], default=str), flush=True)
    spread = {}
    for name in args.models:
        got = [r for r in rows if r["model"] == name]
        key = MAIN_METRIC.get(got[0]["task"], "map50")
        vals = [r["val_best"].get(key, float("nan")) for r in got]
        spread[name] = {"metric": key, "seeds": [r["seed"] for r in got], "values": vals,
                        "mean": round(sum(vals) / len(vals), 4), "min": min(vals), "max": max(vals)}
    if len(args.seed) > 1:
        print(json.dumps({"spread": spread}), flush=True)
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor(),
           "torch": torch.__version__, "rows": rows, "spread": spread}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
