"""Training-step benchmark: eager vs captured forward+loss+backward, one process per arm.

    PYTHONPATH=. python3 benchmarks/train_step.py --arm eager --batch 8 --imgsz 640 --amp
    PYTHONPATH=. python3 benchmarks/train_step.py --all --json out.json   # runs each arm in its own process

One real batch of the built-in shapes set is replayed: forward, YOLOv9 loss, backward and
the optimizer step (eager in both arms). Medians over --runs after --warmup, with the
device synchronized around each step.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time

import torch


def run_arm(arm: str, batch: int, imgsz: int, amp: bool, runs: int, warmup: int) -> dict:
    from libreyolo import LibreYOLO
    from libreyolo.data.augment import DetectionDataset, collate_detections
    from libreyolo.data.datasets import resolve_data
    from libreyolo.graphs.training import TrainStepRunner

    data = resolve_data("shapes")
    ds = DetectionDataset(data.train, imgsz, augment=False)
    imgs, targets, mask = collate_detections([ds[i] for i in range(batch)], bucket=16)
    model = LibreYOLO.new("yolo9", "t", nc=data.nc, device="cuda", seed=0)
    net = model.model.train()
    loss_fn = model.build_loss().cuda()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    x = imgs.cuda().float().div_(255)
    t, k = targets.cuda(), mask.cuda()

    def step(x, t, k):
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss, items = loss_fn(net(x), t, k)
        scaler.scale(loss).backward()
        return loss.detach(), items.detach()

    runner = TrainStepRunner(net, step, enabled=arm != "eager", family="yolo9", supported=True, repeat=1)
    opt.zero_grad(set_to_none=False)

    def one():
        runner(x, t, k)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)

    for _ in range(warmup):
        one()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        one()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return {"arm": arm, "median_ms": statistics.median(samples), "min_ms": min(samples), "runs": runs,
            "runner": runner.info()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", choices=["eager", "fwd_bwd"], default="eager")
    ap.add_argument("--all", action="store_true", help="run every arm, each in its own process")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not a.all:
        print(json.dumps(run_arm(a.arm, a.batch, a.imgsz, a.amp, a.runs, a.warmup)))
        return
    arms = {}
    for arm in ("eager", "fwd_bwd"):
        cmd = [sys.executable, __file__, "--arm", arm, "--batch", str(a.batch), "--imgsz", str(a.imgsz),
               "--runs", str(a.runs), "--warmup", str(a.warmup)] + (["--amp"] if a.amp else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        arms[arm] = json.loads(out)
    res = {"model": "yolo9-t", "batch": a.batch, "imgsz": a.imgsz, "amp": a.amp, "arms": arms,
           "speedup_fwd_bwd": arms["eager"]["median_ms"] / arms["fwd_bwd"]["median_ms"],
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": dt.date.today().isoformat()}
    print(json.dumps(res, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
