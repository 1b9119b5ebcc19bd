"""Distributed training throughput: images/s on 1 GPU vs N GPUs at the same per-GPU batch, eager
and with the whole step captured (the NCCL all-reduce of the gradients inside the graph).

    PYTHONPATH=. python3 benchmarks/ddp_throughput.py --gpus 2 --json benchmarks/results/ddp.json
    PYTHONPATH=. python3 benchmarks/ddp_throughput.py --gpus 2 --per-gpu 16 --arms graph   # one cell

Every cell (per-GPU batch x world size x arm) is its own torchrun run (``python -m
torch.distributed.run --standalone``, the launcher ``device=0,1`` uses) of this script in
``--worker`` mode: each rank builds the trainer exactly as ``model.train`` does (``Trainer.setup``:
process group, flat gradient buffer, loss share rule, fused SGD with a tensor lr, bf16 autocast,
channels_last), then times ``Trainer.step`` on one fixed batch of the built-in set - the host to
device copy, the step (forward, loss, backward, all-reduce, clipping, SGD, EMA: eager, or one
replay of the captured whole step) and the host copy of the loss items, i.e. the trainer's per-step
work without the DataLoader. images/s = global batch x steps / wall time (all ranks synchronized
before and after). The scaling column is the N-GPU images/s over the 1-GPU images/s of the same
arm and per-GPU batch (the issue's target: >= 1.9 on 2 GPUs with capture).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def worker(a) -> None:
    import torch.distributed as dist

    from libreyolo import LibreYOLO
    from libreyolo.distributed import env_rank, env_world
    from libreyolo.engine.config import TrainConfig
    from libreyolo.engine.trainer import Trainer

    rank, world = env_rank(), env_world()
    a.per_gpu = a.per_gpu[0]   # a worker measures one cell
    model = LibreYOLO.new(*_spec(a.model), device=a.device, seed=0)
    batch = a.per_gpu * world
    kw = dict(data=a.data, epochs=1, batch=batch, nbs=batch, imgsz=a.imgsz, workers=0, cuda_graph=a.arm == "graph",
              amp="bf16", warmup_epochs=0, val=False, plots=False, verbose=False, seed=0, mosaic=0.0,
              project=a.project, name="bench", exist_ok=True, device=a.device)
    t = Trainer(model, TrainConfig.from_kwargs(model.task_def, **{**model.train_defaults(), **kw}))
    t.setup()
    t.nw, t.last_opt_step, t.accumulate = -1, -1, 1   # every step an update (the whole step when captured)
    t.opt.zero_grad(set_to_none=False)
    ds = t.val_set
    collate = t.val_loader.collate_fn
    local = collate([ds[(rank * a.per_gpu + i) % len(ds)] for i in range(a.per_gpu)])
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    for i in range(a.warmup):
        t.step(i, local)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.runs):
        t.step(a.warmup + i, local)
    sync()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        res = {"world": world, "per_gpu": a.per_gpu, "global_batch": batch, "arm": a.arm, "runs": a.runs,
               "images_per_s": batch * a.runs / elapsed, "step_ms": elapsed / a.runs * 1e3,
               "graph": t.step_runner.info()}
        Path(a.json).write_text(json.dumps(res))
    dist.destroy_process_group()


def _spec(name: str):
    from libreyolo.models.registry import parse_spec
    cls, size = parse_spec(name)
    return cls.FAMILY, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="yolo9t")
    ap.add_argument("--gpus", type=int, default=2, help="N of the N-GPU runs (1-GPU runs are measured too)")
    ap.add_argument("--per-gpu", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--arm", default="eager", help=argparse.SUPPRESS)
    ap.add_argument("--arms", nargs="+", default=["eager", "graph"], choices=["eager", "graph"])
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)   # cpu: a dry run of a worker (gloo)
    ap.add_argument("--project", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    from libreyolo.launch import launch_env, torchrun_command
    from libreyolo.tasks import get_task
    if torch.cuda.device_count() < a.gpus:
        sys.exit(f"--gpus {a.gpus}: this machine has {torch.cuda.device_count()} GPU(s)")
    data = "shapes"
    get_task("detect").resolve_data(data)   # generated here once, not by every rank at the same time
    cells = []
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        for per_gpu in a.per_gpu:
            for world in sorted({1, a.gpus}):
                for arm in a.arms:
                    out = Path(tmp) / f"{per_gpu}-{world}-{arm}.json"
                    cmd = torchrun_command(world, [__file__, "--worker", "--model", a.model, "--per-gpu", str(per_gpu),
                                                   "--arm", arm, "--imgsz", str(a.imgsz), "--runs", str(a.runs),
                                                   "--warmup", str(a.warmup), "--data", data, "--project",
                                                   str(Path(tmp) / "runs"), "--json", str(out)])
                    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True)
                    if proc.returncode != 0 or not out.is_file():
                        cell = {"world": world, "per_gpu": per_gpu, "arm": arm,
                                "error": proc.stderr.strip().splitlines()[-5:] or ["failed"]}
                    else:
                        cell = json.loads(out.read_text())
                    cells.append(cell)
                    print(json.dumps(cell), flush=True)
    one = {(c["per_gpu"], c["arm"]): c.get("images_per_s") for c in cells if c["world"] == 1}
    for c in cells:
        base = one.get((c["per_gpu"], c["arm"]))
        if c["world"] > 1 and base and c.get("images_per_s"):
            c["scaling_vs_1gpu"] = c["images_per_s"] / base
    print(f"{'per-GPU batch':>13} {'GPUs':>4} {'arm':>6} {'images/s':>10} {'step ms':>8} {'scaling':>8}")
    for c in cells:
        if "error" in c:
            print(f"{c['per_gpu']:>13} {c['world']:>4} {c['arm']:>6}  error: {' | '.join(c['error'])}")
        else:
            s = c.get("scaling_vs_1gpu")
            print(f"{c['per_gpu']:>13} {c['world']:>4} {c['arm']:>6} {c['images_per_s']:>10.1f} {c['step_ms']:>8.2f} "
                  f"{'' if s is None else f'{s:.2f}x':>8}")
    res = {"model": a.model, "imgsz": a.imgsz, "amp": "bf16", "gpus": a.gpus, "cells": cells,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "date": dt.date.today().isoformat()}
    if a.json:
        from libreyolo.benchmark import write_json
        write_json(res, a.json)


if __name__ == "__main__":
    main()
