"""Whole-run benchmark: the same training run eager and with ``cuda_graph=True``.

    PYTHONPATH=. python3 benchmarks/train_epochs.py --epochs 20 --imgsz 320 --batch 16 --json out.json

Each arm is its own process (same seed, same data, same settings); the figure is the wall
time of ``model.train`` (data loading, training, per-epoch validation and checkpoints all
included) and the final mAP. Built-in shapes dataset; an untrained yolo9-t by default.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time


def run_arm(arm: str, a) -> dict:
    from libreyolo.models.registry import parse_spec

    cls, size = parse_spec(a.model)
    if arm == "graph":
        cls.SUPPORTS_CUDA_GRAPH_TRAIN = cls.SUPPORTS_CUDA_GRAPH_TRAIN or a.force
    model = cls.new(size, device=a.device, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = model.train(data="shapes", epochs=a.epochs, batch=a.batch, imgsz=a.imgsz, workers=a.workers,
                          amp=a.amp, cuda_graph=arm == "graph", project=tmp, plots=False, verbose=False, seed=0)
        wall = time.perf_counter() - t0
    return {"arm": arm, "wall_s": wall, "map50": res["map50"], "map50_95": res["map50_95"],
            "losses_last": res["losses"][-1], "cuda_graph": res["cuda_graph"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", choices=["eager", "graph"])
    ap.add_argument("--model", default="yolo9t")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--amp", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--force", action="store_true", help="declare the family train-capturable for this run")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.arm:
        print(json.dumps(run_arm(a.arm, a)))
        return
    import torch
    from train_step import run_in_processes   # this folder is on sys.path when run as a script
    arms = run_in_processes(__file__, ("eager", "graph"), [f"--{k}={v}" for k, v in
                            (("model", a.model), ("epochs", a.epochs), ("batch", a.batch), ("imgsz", a.imgsz),
                             ("workers", a.workers), ("amp", a.amp), ("device", a.device))]
                            + (["--force"] if a.force else []), error_lines=3)
    res = {"model": a.model, "epochs": a.epochs, "batch": a.batch, "imgsz": a.imgsz, "amp": a.amp, "arms": arms,
           "device": torch.cuda.get_device_name(0) if a.device == "cuda" else a.device, "torch": torch.__version__, "date": dt.date.today().isoformat()}
    if all("wall_s" in v for v in arms.values()):
        res["speedup"] = arms["eager"]["wall_s"] / arms["graph"]["wall_s"]
    print(json.dumps(res, indent=2))
    if a.json:
        from libreyolo.benchmark import write_json
        write_json(res, a.json)


if __name__ == "__main__":
    main()
