"""One rank of the 2-process gloo run of test_ddp_cpu.py (the test forks one process per rank).

``main(rank, world, ports, data, project, out)`` runs, in order, writing what it saw to
``out/rank<R>.json`` after each part (the first two in a gloo group made here, each training run
in the group the trainer itself joins from the torchrun-style environment and leaves at its end):

* ``grads``: for each family of :data:`SHARE_FAMILIES`, one batch of 8 split 4 + 4 over the ranks
  (the loss in its share form, the flat gradient buffer summed by
  :class:`~libreyolo.distributed.GradientReducer`) against rank 0's one-process gradients of the
  whole batch; a toy mean loss for the ``"mean"`` rule;
* ``agree``: a stand-in capturer that fails on rank 1 only: both ranks must drop capture;
* ``run``: two epochs of the trainer (2 x 2 steps, global batch 8) with per-step weight
  comparisons across the ranks, the sampler's indices and each step's target rows recorded
  (rank 1 pads its targets to 32 rows, rank 0 to 16: the step must pad both to the larger);
* ``resume``: a third epoch with ``resume=True`` (both ranks load last.pt);
* ``fault``: rank 1 exits in the middle of an epoch; rank 0 must stop with a TrainingError.
"""
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

torch.set_num_threads(1)


def _write(out: Path, rank: int, report: dict) -> None:
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(report))
    os.replace(tmp, out / f"rank{rank}.json")


def _flat_params(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in net.parameters()])


def _same_on_all_ranks(t: torch.Tensor, world: int) -> bool:
    got = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(got, t)
    return all(torch.equal(got[0], g) for g in got)


#: the families whose loss computes its share of the global batch ("sum" rule)
SHARE_FAMILIES = (("yolo9", "t"), ("yolox", "n"), ("yolo7", "tiny"), ("rtmdet", "t"), ("picodet", "s"))


def grads(rank: int, world: int, data: str) -> dict:
    from libreyolo.data.augment import DetectionDataset, collate_detections
    from libreyolo.data.datasets import resolve_data
    from libreyolo.distributed import GradientReducer, loss_share, reduction_of
    from libreyolo.models.registry import get_family

    ds = DetectionDataset(resolve_data(data).train, 64, augment=False)
    imgs, targets, mask = collate_detections([ds[j] for j in range(8)])
    n = imgs.shape[0] // world
    part = slice(rank * n, (rank + 1) * n)
    report: dict = {}
    for family, size in SHARE_FAMILIES:
        m = get_family(family).new(size, nc=5, device="cpu", seed=0)
        net, loss_fn = m.model.train(), m.build_loss()
        for mod in net.modules():   # batch statistics of 4 images are not those of 8: fixed statistics here
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.eval()
        x = m.preprocess.normalize(imgs.float() / 255)
        params = [p for p in net.parameters() if p.requires_grad]
        rep: dict = {"rule": reduction_of(loss_fn)}
        ref = ref_items = None
        if rank == 0:   # the one-process gradient of the whole batch
            loss, items = loss_fn(m.train_forward(net, x, targets, mask), targets, mask)
            loss.backward()
            ref = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
            ref_items = items
            for p in params:
                p.grad = None
        reduce = GradientReducer(params, world, mean=rep["rule"] == "mean")
        with loss_share():
            loss, items = loss_fn(m.train_forward(net, x[part], targets[part], mask[part]), targets[part],
                                  mask[part])
        loss.backward()
        reduce()
        dist.all_reduce(items)
        rep["views_kept"] = reduce.attached()
        if rank == 0:
            scale = max(float(r.abs().max()) for r in ref)
            rep["max_rel_diff"] = max(float((p.grad - r).abs().max()) for p, r in zip(params, ref)) / scale
            rep["allclose"] = all(torch.allclose(p.grad, r, rtol=1e-4, atol=1e-5 * scale) for p, r in zip(params, ref))
            rep["items_close"] = bool(torch.allclose(items, ref_items, rtol=1e-5, atol=1e-7))
            rep["grad_norm"] = float(torch.cat([r.flatten() for r in ref]).norm())
        report[family] = rep
    # the "mean" rule: a per-sample mean over equal local batches, gradients averaged
    torch.manual_seed(1)
    toy, xs, ys = nn.Linear(6, 3), torch.randn(8, 6), torch.randn(8, 3)
    if rank == 0:
        nn.functional.mse_loss(toy(xs), ys).backward()
        ref = [p.grad.clone() for p in toy.parameters()]
        for p in toy.parameters():
            p.grad = None
    reduce = GradientReducer(list(toy.parameters()), world, mean=True)
    nn.functional.mse_loss(toy(xs[part]), ys[part]).backward()
    reduce()
    if rank == 0:
        report["mean_rule_close"] = all(torch.allclose(p.grad, r, rtol=1e-5, atol=1e-7)
                                        for p, r in zip(toy.parameters(), ref))
    return report


def agree(rank: int, world: int) -> dict:
    from libreyolo.distributed import Distributed, GradientReducer
    from libreyolo.graphs.training import TrainStepRunner

    d = Distributed.setup("cpu")
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    reduce = GradientReducer(list(net.parameters()), world, mean=True)

    def step(x):
        loss = net(x).square().mean()
        loss.backward()
        reduce()   # a collective inside the step, as the trainer's whole step has
        return loss.detach(), d.reduce_items(loss.detach().reshape(1), "mean")

    class Graph:
        def __init__(self, inputs):
            self.static = tuple(t.clone() for t in inputs)

        def replay(self, inputs, clone=True):
            for s, t in zip(self.static, inputs):
                s.copy_(t)
            return step(*self.static)

    class StandIn:   # warms up like the real capturer (collectives run), fails on rank 1 only
        can_capture = staticmethod(lambda device: True)

        def capture(self, fn, inputs, module=None):
            for _ in range(3):
                fn(*inputs)
            if rank == 1:
                raise RuntimeError("operation not permitted when stream is capturing (stand-in)")
            return Graph(inputs)

    runner = TrainStepRunner(net, step, enabled=True, family="toy", supported=True, capturer=StandIn(),
                             agree=d.agree)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(rank))
    for _ in range(6):
        runner(x)
    info = runner.info()
    info["weights_same"] = _same_on_all_ranks(_flat_params(net), world)
    return info


def train(rank: int, world: int, data: str, project: str, *, epochs: int, resume: bool = False,
          name: str = "run", die_at: int | None = None) -> dict:
    from libreyolo import LibreYOLO
    from libreyolo.engine import loaders as LD
    from libreyolo.engine import runs as R
    from libreyolo.engine import trainer as T

    seen: list = []

    class Recording(LD.EpochSeeded):   # the indices the sampler hands this rank, per epoch
        def __getitem__(self, index):
            seen.append((int(self._epoch[0]), int(index)))
            return super().__getitem__(index)

    same: list = []
    sizes: list = []
    rows: list = []   # per step: (this rank's own target rows, the rows the step ran with)

    class Trainer(T.Trainer):
        def device_batch(self, batch):
            out = super().device_batch(batch)
            rows.append((int(batch[1].shape[1]), int(out[1].shape[1])))
            return out

        def step(self, ni, batch):
            if die_at is not None and rank == 1 and ni == die_at:
                os._exit(3)   # a rank that dies mid-epoch (no clean-up, as a crash or a kill)
            items = super().step(ni, batch)
            sizes.append(int(batch[0].shape[0]))
            same.append(_same_on_all_ranks(_flat_params(self.net), world))
            return items

    LD.EpochSeeded = Recording
    try:
        model = LibreYOLO.new("yolo9", "t", nc=80, device="cpu", seed=0)
        kw = dict(data=data, epochs=epochs, batch=8, imgsz=64, workers=0, project=project, name=name, val=True,
                  plots=False, verbose=False, seed=0, nbs=8, warmup_epochs=0, close_mosaic=1, resume=resume,
                  ddp_timeout=60, bucket=16 if rank == 0 else 32)   # the ranks' own target rows differ
        if resume or die_at is not None:   # validation (rank 0, the other waiting) is exercised by the first run
            kw["val"] = False
        cfg = T.TrainConfig.from_kwargs(model.task_def, **{**model.train_defaults(), **kw})
        t = Trainer(model, cfg)
        try:
            res = t.train()
        except R.TrainingError as exc:
            return {"error": str(exc), "error_type": type(exc).__name__}
        return {"run_dir": res["run_dir"], "epochs": res["epochs"], "start_epoch": t.start_epoch, "same": same,
                "seen": seen, "losses": res["losses"], "local_batches": sizes, "rows": rows}
    finally:
        LD.EpochSeeded = Recording.__mro__[1]


def main(rank: int, world: int, ports: list, data: str, project: str, out: str) -> None:
    """``ports``: one free port per part that makes its own process group (see the module doc)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))
    out_dir = Path(out)
    report: dict = {"seconds": {}}

    def timed(name, part):
        t0 = time.perf_counter()
        report[name] = part()
        report["seconds"][name] = round(time.perf_counter() - t0, 2)
        _write(out_dir, rank, report)

    try:
        # the first two parts share a group made here (the trainer uses a group it finds as is)
        os.environ["MASTER_PORT"] = str(ports[0])
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        timed("grads", lambda: grads(rank, world, data))
        timed("agree", lambda: agree(rank, world))
        dist.destroy_process_group()
        # each training run joins and leaves its own group, as under torchrun (env:// from RANK etc.)
        runs = [("run", dict(epochs=2)), ("resume", dict(epochs=3, resume=True)),
                ("fault", dict(epochs=2, name="fault", die_at=3))]
        for (name, kw), port in zip(runs, ports[1:]):
            os.environ["MASTER_PORT"] = str(port)
            timed(name, lambda: train(rank, world, data, project, **kw))
            report[name]["group_left"] = not dist.is_initialized()
            _write(out_dir, rank, report)
    except BaseException:  # the test reads it
        import traceback
        report["crash"] = traceback.format_exc()
        _write(out_dir, rank, report)
        os._exit(1)
    os._exit(0)
