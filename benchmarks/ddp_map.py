"""Final mAP of a multi-GPU run against one GPU's seed-to-seed spread (issue 18's accuracy target).

    PYTHONPATH=. python3 benchmarks/ddp_map.py --gpus 2 --epochs 30 --json benchmarks/results/ddp-map.json

Three ``libreyolo train`` runs of the same recipe on the built-in set (global batch ``--batch``,
capture on, bf16): one GPU with seed 0, one GPU with seed 1 (the spread), and ``--gpus`` GPUs
with seed 0 (``device=0,1,...``: torchrun, the batch split across the GPUs). Each run's last
mAP50-95 comes from its ``results.csv``; the multi-GPU run passes when its distance to the seed-0
run is within the two seeds' distance (or 0.005, whichever is larger).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def last_map(run_dir: Path) -> float:
    rows = list(csv.DictReader((run_dir / "results.csv").open()))
    key = next(k for k in rows[-1] if k.endswith("mAP50-95"))
    return float(rows[-1][key])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="yolo9t")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="global batch (every run)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if torch.cuda.device_count() < a.gpus:
        sys.exit(f"--gpus {a.gpus}: this machine has {torch.cuda.device_count()} GPU(s)")
    runs = {"1gpu_seed0": ("0", 0), "1gpu_seed1": ("0", 1),
            f"{a.gpus}gpu_seed0": (",".join(map(str, range(a.gpus))), 0)}
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="ddp-map-") as tmp:
        for name, (device, seed) in runs.items():
            cmd = [sys.executable, "-m", "libreyolo.cli", "train", f"model={a.model}", "data=shapes",
                   f"epochs={a.epochs}", f"batch={a.batch}", f"imgsz={a.imgsz}", "amp=bf16", "cuda_graph=true",
                   f"device={device}", f"seed={seed}", f"project={tmp}", f"name={name}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                out[name] = {"error": proc.stderr.strip().splitlines()[-5:]}
            else:
                out[name] = {"map50_95": last_map(Path(tmp) / name)}
            print(name, json.dumps(out[name]), flush=True)
    maps = {k: v.get("map50_95") for k, v in out.items()}
    res = {"model": a.model, "epochs": a.epochs, "batch": a.batch, "imgsz": a.imgsz, "runs": out,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": dt.date.today().isoformat()}
    if None not in maps.values():
        spread = abs(maps["1gpu_seed0"] - maps["1gpu_seed1"])
        gap = abs(maps[f"{a.gpus}gpu_seed0"] - maps["1gpu_seed0"])
        res.update(seed_spread=spread, ddp_gap=gap, within=gap <= max(spread, 0.005))
        print(f"seed spread {spread:.4f}, {a.gpus}-GPU gap {gap:.4f}: {'within' if res['within'] else 'OUTSIDE'}")
    if a.json:
        from libreyolo.benchmark import write_json
        write_json(res, a.json)


if __name__ == "__main__":
    main()
