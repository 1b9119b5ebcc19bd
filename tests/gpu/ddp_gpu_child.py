"""One rank of test_ddp_gpu.py's runs, started by torchrun (NCCL, one GPU per rank).

    python -m torch.distributed.run --standalone --nproc-per-node N tests/gpu/ddp_gpu_child.py DATA OUT.json

On each rank, in order, with the trainer's own set-up (``Trainer.setup``: process group, flat
gradient buffer, loss share rule, fused SGD with a tensor lr, bf16 autocast):

* ``steps``: 20 steps on two fixed global batches (each rank its slice), three eager runs and one
  captured run (capture at the first step: the whole step - forward, loss,
  backward, the NCCL all-reduce of the flat gradient buffer, clipping, SGD, EMA - is one graph).
  Each run records, per step, this rank's local loss (the share it back-propagates) and the
  all-reduced loss items;
* ``train``: ``Trainer.train()`` for two short epochs with ``cuda_graph=True`` (the trainer's own
  loop, sampler and hooks), reporting its graph statistics.

Rank r writes OUT with ``.rank<r>`` before the suffix. ``LIBREYOLO_DDP_CHILD_DEVICE=cpu`` runs the
same on the CPU over gloo (capture then falls back to eager: a dry run of the script itself).
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

STEPS = 20
PER_RANK = 8
IMGSZ = 128
DEVICE = os.environ.get("LIBREYOLO_DDP_CHILD_DEVICE", "cuda")


def _trainer(data: str, project: str, graph: bool, world: int, **extra):
    from libreyolo import LibreYOLO
    from libreyolo.engine.config import TrainConfig
    from libreyolo.engine.trainer import Trainer
    model = LibreYOLO.new("yolo9", "t", nc=5, device=DEVICE, seed=0)
    kw = dict(data=data, epochs=1, batch=PER_RANK * world, nbs=PER_RANK * world, imgsz=IMGSZ, workers=0,
              cuda_graph=graph, amp="bf16", warmup_epochs=0, val=False, plots=False, verbose=False, seed=0,
              project=project, name="run", exist_ok=True, mosaic=0.0, device=DEVICE)
    kw.update(extra)
    cfg = TrainConfig.from_kwargs(model.task_def, **{**model.train_defaults(), **kw})
    return model, Trainer(model, cfg)


class Recorder:
    """Stands in for the trainer's step runner: forwards the call, keeps the local loss."""

    def __init__(self, runner):
        self.runner, self.losses = runner, []

    def __call__(self, *inputs, whole=False):
        loss, items = self.runner(*inputs, whole=whole)
        self.losses.append(loss)
        return loss, items

    def __getattr__(self, name):
        return getattr(self.runner, name)


def steps(data: str, project: str, graph: bool, batches, rank: int, world: int) -> dict:
    # both arms are built with cuda_graph=True - the whole-step optimizer (fused SGD, tensor lr) -, so
    # they compute the same arithmetic; the eager arm runs the very same step without capture
    _, t = _trainer(data, project, True, world)
    t.setup()
    if graph:
        t.step_runner._graphs.repeat = 1   # capture at the first step: step 0 is a replay
    else:
        t.step_runner.active = False
    t.nw, t.last_opt_step, t.accumulate = -1, -1, 1   # every step a whole step (update included)
    t.opt.zero_grad(set_to_none=False)
    rec = Recorder(t.step_runner)
    t.step_runner = rec
    items = []
    for i in range(STEPS):
        imgs, tg, mk = batches[i % 2]
        part = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        items.append(t.step(i, (imgs[part], tg[part], mk[part])).tolist())
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return {"local_loss_hex": [float(v).hex() for v in rec.losses], "local_loss": [float(v) for v in rec.losses],
            "items": items, "graph": rec.runner.info(), "whole_step": t.whole_step}


def make_batches(data: str, world: int) -> list:
    """The two fixed global batches (unaugmented images of the training split)."""
    from libreyolo.data.augment import DetectionDataset, collate_detections
    from libreyolo.data.datasets import resolve_data
    ds = DetectionDataset(resolve_data(data).train, IMGSZ, augment=False)
    n = PER_RANK * world
    return [collate_detections([ds[j] for j in range(b * n, (b + 1) * n)], bucket=16) for b in range(2)]


def main(data: str, out: str) -> None:
    from libreyolo.distributed import env_rank, env_world

    rank, world = env_rank(), env_world()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    batches = make_batches(data, world)
    project = str(Path(out).parent / "runs")
    report = {"rank": rank, "world": world}
    report["eager"] = [steps(data, project, False, batches, rank, world) for _ in range(3)]
    report["graph"] = steps(data, project, True, batches, rank, world)
    _, t = _trainer(data, project, True, world, epochs=2, name="train")
    res = t.train()
    report["train"] = {"cuda_graph": res["cuda_graph"], "losses": res["losses"], "run_dir": res["run_dir"]}
    path = Path(out)
    path.with_name(f"{path.stem}.rank{rank}{path.suffix}").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
