"""Task-generic training loop; the family supplies the network and the loss.

Features: YOLO/COCO datasets or the built-in ``shapes`` set, mosaic/affine/flip/HSV
augmentation (mosaic and MixUp closed for the last ``close_mosaic`` epochs), DataLoader with workers and
pinned memory, AMP on CUDA, SGD or AdamW with parameter groups (no decay on norms and
biases), warm-up then linear or cosine decay, gradient accumulation to a nominal batch,
an exponential moving average of the weights, validation (mAP50, mAP50-95) every epoch,
``last.pt`` / ``best.pt`` in the LibreYOLO format written atomically, ``resume``, a
progress bar with running losses, ``results.csv`` and ``results.png``.

With ``cuda_graph=True`` the forward + loss + backward step goes through
:class:`libreyolo.graphs.training.TrainStepRunner`, which captures it once a batch shape
repeats and falls back to eager with one log line wherever that is not possible.
"""
from __future__ import annotations

import copy
import csv
import functools
import logging
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..graphs.training import GraphedSegment, TrainStepRunner, prime_optimizer_state, training_state
from ..ops.nms import nms_per_image, top_candidates

log = logging.getLogger("libreyolo")


@dataclass
class TrainConfig:
    data: str = "shapes"
    epochs: int = 100
    batch: int = 16
    imgsz: int = 640
    device: str = "auto"
    workers: int = 2
    optimizer: str = "SGD"          # SGD or AdamW
    lr0: float | None = None        # default 0.01 for SGD, 0.001 for AdamW
    lrf: float = 0.01               # final lr = lr0 * lrf
    momentum: float = 0.937
    weight_decay: float = 5e-4
    clip_grad: float = 10.0         # max gradient norm (YOLO recipes 10; DETR recipes 0.1)
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cos_lr: bool = False
    nbs: int = 64                   # nominal batch: gradients accumulate up to it
    amp: Any = True                 # True: float16 autocast + GradScaler; "bf16": bfloat16, no scaler (CUDA only)
    ema: bool = True
    close_mosaic: int = 10
    mosaic: float = 1.0
    dense_mosaic: bool = False      # DEIM's Dense O2O: mosaic tiles shrunk so each image holds all four
    mixup: float = 0.0              # probability of blending two augmented samples (closed with mosaic)
    augment_policy: str = "yolo"    # "yolo" (affine + HSV) or "detr" (photometric, zoom-out, IoU crop)
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    fliplr: float = 0.5
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    bucket: int = 16                # targets padded to a multiple of this (fixed loss shapes)
    val: bool = True
    val_conf: float = 0.001
    val_iou: float = 0.7
    max_det: int = 300
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    resume: Any = False             # True (the run's last.pt) or a path
    seed: int = 0
    cuda_graph: bool = False
    plots: bool = True
    verbose: bool = True
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, **kw) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise TypeError(f"unknown training option(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return cls(**kw)


class ModelEMA:
    """Exponential moving average of weights with a warm-up of the decay (tau iterations).

    The update count lives in a device tensor and the decay is computed from it on the
    device, so one update is a fixed sequence of kernels with no Python-side number in it:
    the same code runs eager and inside a captured whole training step.
    """

    def __init__(self, net: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.ema = copy.deepcopy(net).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau = decay, tau
        dev = next(self.ema.parameters()).device
        self.count = torch.full((), float(updates), device=dev)
        self._pairs(net)

    def _pairs(self, net: nn.Module) -> None:
        src, dst = net.state_dict(), self.ema.state_dict()
        self._float = [(dst[k], src[k]) for k in dst if dst[k].dtype.is_floating_point]
        self._other = [(dst[k], src[k]) for k in dst if not dst[k].dtype.is_floating_point]

    @property
    def updates(self) -> int:
        return int(self.count.item())

    @updates.setter
    def updates(self, value: int) -> None:
        self.count.fill_(float(value))

    @torch.no_grad()
    def update(self, net: nn.Module | None = None) -> None:
        """Blend in the weights of the network given at construction (``net`` is accepted for
        symmetry; the pairs are fixed so that a captured step reads stable addresses)."""
        self.count.add_(1.0)
        d = self.decay * (1 - torch.exp(-self.count / self.tau))
        ema = [e for e, _ in self._float]
        torch._foreach_mul_(ema, d)
        torch._foreach_add_(ema, torch._foreach_mul([s.detach() for _, s in self._float], 1 - d))
        for e, s in self._other:
            e.copy_(s)

    def tensors(self) -> list[torch.Tensor]:
        return [e for e, _ in self._float] + [e for e, _ in self._other] + [self.count]


def _param_groups(net: nn.Module, weight_decay: float):
    """Decayed weights, undecayed norm weights, biases; trainable only, each tensor once (a
    parameter registered under two modules, like D-FINE's shared ``up``, is listed once)."""
    decay, no_decay, bias = [], [], []
    seen: set[int] = set()
    for module in net.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if name == "bias":
                bias.append(p)
            elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
                no_decay.append(p)
            else:
                decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0},
            {"params": bias, "weight_decay": 0.0}]


def _next_run_dir(project: str, name: str, exist_ok: bool) -> Path:
    base = Path(project) / name
    if exist_ok or not base.exists():
        return base
    i = 2
    while (Path(project) / f"{name}{i}").exists():
        i += 1
    return Path(project) / f"{name}{i}"


class Trainer:
    """Trains ``model`` (a libreyolo Model) according to a :class:`TrainConfig`."""

    def __init__(self, model, cfg: TrainConfig):
        from ..models.base import select_device
        self.model = model
        self.cfg = cfg
        self.device = select_device(cfg.device) if cfg.device != "auto" else model.device
        self.model.to(self.device)
        amp = str(cfg.amp).lower()
        self.amp_dtype = None
        if self.device.type == "cuda" and amp not in ("false", "0", "none", ""):
            self.amp_dtype = torch.bfloat16 if amp in ("bf16", "bfloat16") else torch.float16
        self.amp = self.amp_dtype is not None

    # ------------------------------------------------------------------ data
    def _loaders(self, data):
        from ..data.augment import DetectionDataset, collate_detections
        cfg = self.cfg
        hyp = dict(mosaic=cfg.mosaic, degrees=cfg.degrees, translate=cfg.translate, scale=cfg.scale,
                   fliplr=cfg.fliplr, hsv_h=cfg.hsv_h, hsv_s=cfg.hsv_s, hsv_v=cfg.hsv_v,
                   dense_mosaic=cfg.dense_mosaic, mixup=cfg.mixup, policy=cfg.augment_policy)
        resize = self.model.RESIZE   # as predict feeds the network: letterbox or stretch
        self.train_set = DetectionDataset(data.train, cfg.imgsz, augment=True, resize=resize, **hyp)
        self.val_set = DetectionDataset(data.val, cfg.imgsz, augment=False, resize=resize)
        collate = functools.partial(collate_detections, bucket=cfg.bucket)  # picklable under spawn

        # One generator, re-seeded at every epoch (seed + epoch): the shuffle order and the
        # workers' augmentation seeds of epoch e are the same in a resumed run.
        self.loader_gen = torch.Generator().manual_seed(cfg.seed)
        pin = self.device.type == "cuda"
        workers = max(0, int(cfg.workers))
        common = dict(num_workers=workers, pin_memory=pin, collate_fn=collate)
        train = torch.utils.data.DataLoader(self.train_set, batch_size=cfg.batch, shuffle=True,
                                            generator=self.loader_gen,
                                            drop_last=len(self.train_set) > cfg.batch, **common)
        val = torch.utils.data.DataLoader(self.val_set, batch_size=cfg.batch, shuffle=False, **common)
        return train, val

    # ------------------------------------------------------------------ validate
    @torch.no_grad()
    def validate(self, net: nn.Module, loader, nc: int, names: dict[int, str]) -> dict:
        from .metrics import evaluate_detections
        was_training = net.training
        net.eval()
        infer = self.model.infer_with(net)
        preds, gts = [], []
        for imgs, targets, mask in loader:
            x = imgs.to(self.device, non_blocking=True).float().div_(255)
            with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float16, enabled=self.amp):
                cand = top_candidates(*infer(x), 30000)
            dets = nms_per_image(*cand, conf=self.cfg.val_conf, iou=self.cfg.val_iou,
                                 max_det=self.cfg.max_det, nms_free=not self.model.NMS)
            for i in range(imgs.shape[0]):
                d = dets[dets[:, 0] == i, 1:]
                preds.append(d.numpy())
                gts.append(targets[i][mask[i]].numpy())
        net.train(was_training)
        return evaluate_detections(preds, gts, nc, names)

    # ------------------------------------------------------------------ train
    def train(self) -> dict:
        from ..data.datasets import resolve_data
        from ..weights import load_checkpoint, save_checkpoint
        cfg, m = self.cfg, self.model
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        data = resolve_data(cfg.data)
        if data.nc != m.nc:
            log.info("libreyolo: dataset has %d classes, model %d: rebuilding the head for %d classes",
                     data.nc, m.nc, data.nc)
            m.reset_classes(data.nc, data.names)
        else:
            m.names = dict(data.names)
        m.imgsz = cfg.imgsz
        net = m.model
        if not m.trained and not cfg.resume:
            m.init_for_training(net)   # the original recipes' prior bias on class/objectness logits
        net.to(self.device).train()
        loss_fn = m.build_loss().to(self.device)
        item_names = tuple(loss_fn.item_names)  # the loss contract: see Model.build_loss
        train_loader, val_loader = self._loaders(data)
        nb = len(train_loader)
        accumulate = max(round(cfg.nbs / cfg.batch), 1)
        if cfg.lr0 is None:
            cfg.lr0 = 0.001 if cfg.optimizer.lower() == "adamw" else 0.01
        wd = cfg.weight_decay * cfg.batch * accumulate / cfg.nbs
        # A whole training step (optimizer included) can be captured only with a fused SGD
        # whose lr is a device tensor (updated in place by the schedule) and no GradScaler.
        self.whole_step = (cfg.optimizer.lower() == "sgd" and bool(cfg.cuda_graph) and m.SUPPORTS_CUDA_GRAPH_TRAIN
                           and self.device.type == "cuda" and self.amp_dtype != torch.float16)
        groups = _param_groups(net, wd)
        if cfg.optimizer.lower() == "adamw":
            opt = torch.optim.AdamW(groups, lr=cfg.lr0, betas=(cfg.momentum, 0.999))
        elif cfg.optimizer.lower() == "sgd":
            if self.whole_step:
                for g in groups:
                    g["lr"] = torch.tensor(cfg.lr0, device=self.device)
            opt = torch.optim.SGD(groups, lr=cfg.lr0, momentum=cfg.momentum, nesterov=True,
                                  fused=True if self.whole_step else None)
        else:
            raise ValueError(f"optimizer must be SGD or AdamW, got {cfg.optimizer!r}")
        for g in opt.param_groups:
            g["initial_lr"] = cfg.lr0
        scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        ema = ModelEMA(net) if cfg.ema else None

        def lf(epoch: float) -> float:
            x = epoch / max(1, cfg.epochs)
            if cfg.cos_lr:
                return ((1 - math.cos(x * math.pi)) / 2) * (cfg.lrf - 1) + 1
            return (1 - x) * (1.0 - cfg.lrf) + cfg.lrf

        run_dir, start_epoch, best_fitness = None, 0, -1.0
        if cfg.resume:
            last = Path(cfg.resume) if isinstance(cfg.resume, (str, Path)) and cfg.resume is not True \
                else Path(cfg.project) / cfg.name / "weights" / "last.pt"
            ck = load_checkpoint(last)
            st = ck.get("train_state")
            if not st:
                raise ValueError(f"{last} has no training state to resume from")
            net.load_state_dict(st["model_raw"])
            opt.load_state_dict(st["optimizer"])
            if self.whole_step:  # a loaded tensor lr comes back on the CPU
                for g in opt.param_groups:
                    g["lr"] = torch.tensor(float(g["lr"]), device=self.device)
            scaler.load_state_dict(st["scaler"])
            if ema is not None and st.get("ema_updates") is not None:
                ema.ema.load_state_dict(ck["model"])
                ema.updates = int(st["ema_updates"])
            start_epoch, best_fitness = int(st["epoch"]) + 1, float(st["best_fitness"])
            run_dir = last.parent.parent
            log.info("libreyolo: resuming %s from epoch %d", run_dir, start_epoch + 1)
        if run_dir is None:
            run_dir = _next_run_dir(cfg.project, cfg.name, cfg.exist_ok)
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        csv_path = run_dir / "results.csv"

        amp_dtype = self.amp_dtype

        def step(x, targets, mask):
            # no autocast weight cache: a captured graph must not record casts the cache frees later
            with torch.autocast(self.device.type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None,
                                cache_enabled=False):
                outputs = m.train_forward(net, x, targets, mask)
                loss, items = loss_fn(outputs, targets, mask)
            scaler.scale(loss).backward()
            return loss.detach(), items.detach()

        params = [p for p in net.parameters() if p.requires_grad]

        def optimizer_step() -> None:
            if scaler.is_enabled():
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, max_norm=cfg.clip_grad, foreach=True)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=False)
            if ema is not None:
                ema.update(net)

        def mutable_state() -> list[torch.Tensor]:
            return training_state(params, opt, net.buffers(), ema.tensors() if ema is not None else ())

        if self.whole_step:
            prime_optimizer_state(opt)  # buffers a captured update writes must exist before capture
        # Families whose step cannot be one graph may capture a fixed-shape front part instead
        # (DETR: backbone + encoder forward and backward; decoder, matcher and loss eager).
        seam = None
        if (cfg.cuda_graph and self.device.type == "cuda" and not m.SUPPORTS_CUDA_GRAPH_TRAIN
                and m.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM):
            front = m.train_seam(net)
            if front is not None:
                seam = GraphedSegment(front, name=f"{m.FAMILY} backbone+encoder")
                m.set_train_seam(net, seam)
                log.info("libreyolo: training %s with its backbone+encoder in CUDA graphs (forward and "
                         "backward); decoder, matching and loss eager", m.FAMILY)
        runner = TrainStepRunner(net, step, enabled=bool(cfg.cuda_graph) and seam is None, family=m.FAMILY,
                                 supported=m.SUPPORTS_CUDA_GRAPH_TRAIN, update=optimizer_step, state=mutable_state)
        self.step_runner = runner
        nw = max(round(cfg.warmup_epochs * nb), 1) if cfg.warmup_epochs > 0 else 0
        last_opt_step = nb * start_epoch - 1

        history: list[dict] = []
        opt.zero_grad(set_to_none=False)
        t_start = time.time()
        mosaic_closed = False
        for epoch in range(start_epoch, cfg.epochs):
            if cfg.close_mosaic and not mosaic_closed and epoch >= max(0, cfg.epochs - cfg.close_mosaic):
                self.train_set.close_mosaic()
                mosaic_closed = True
                runner.release("mosaic closed for the final epochs")
                log.info("libreyolo: mosaic off for the last %d epochs", cfg.epochs - epoch)
            on_epoch = getattr(loss_fn, "on_epoch", None)
            if on_epoch is not None and on_epoch(epoch, cfg.epochs):
                # the loss computes something else from now on: graphs of the old loss are stale
                runner.release(f"{type(loss_fn).__name__} changed at epoch {epoch + 1}")
            self.loader_gen.manual_seed(cfg.seed + epoch)
            torch.manual_seed(cfg.seed + epoch)
            np.random.seed((cfg.seed + epoch) % 2**32)
            net.train()
            mloss = torch.zeros(len(item_names))
            progress = None
            if cfg.verbose:
                from tqdm import tqdm
                progress = tqdm(total=nb, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch", leave=True)
            for i, (imgs, targets, mask) in enumerate(train_loader):
                ni = i + nb * epoch
                if ni <= nw and nw > 0:
                    xi = [0, nw]
                    accumulate = max(1, round(float(np.interp(ni, xi, [1, cfg.nbs / cfg.batch]))))
                    for j, g in enumerate(opt.param_groups):
                        start = cfg.warmup_bias_lr if j == 2 else 0.0
                        _set_lr(g, float(np.interp(ni, xi, [start, g["initial_lr"] * lf(epoch)])))
                        if "momentum" in g:
                            g["momentum"] = float(np.interp(ni, xi, [cfg.warmup_momentum, cfg.momentum]))
                x = imgs.to(self.device, non_blocking=True).float().div_(255)
                targets = targets.to(self.device, non_blocking=True)
                mask = mask.to(self.device, non_blocking=True)
                update_now = ni - last_opt_step >= accumulate
                if self.whole_step and update_now and ni > nw:  # micro-batches replay the fwd+bwd graph
                    loss, items = runner(x, targets, mask, whole=True)  # update included
                    last_opt_step = ni
                else:
                    loss, items = runner(x, targets, mask)
                    if update_now:
                        optimizer_step()
                        last_opt_step = ni
                items = items.float().cpu()
                if not torch.isfinite(items).all():
                    raise FloatingPointError(f"non-finite loss at epoch {epoch + 1} batch {i}: {items.tolist()}")
                mloss = (mloss * i + items) / (i + 1)
                if progress is not None:
                    progress.set_postfix({**{n: f"{v:.3f}" for n, v in zip(item_names, mloss.tolist())},
                                          "inst": int(mask.sum()), "size": x.shape[-1]})
                    progress.update(1)
            if progress is not None:
                progress.close()
            if last_opt_step < nb * (epoch + 1) - 1:
                # flush gradients still accumulating, so an epoch is self-contained and a
                # resumed run continues exactly where the interrupted one stopped
                optimizer_step()
                last_opt_step = nb * (epoch + 1) - 1
            for g in opt.param_groups:
                _set_lr(g, g["initial_lr"] * lf(epoch + 1))
            eval_net = ema.ema if ema is not None else net
            metrics = {"map50": float("nan"), "map50_95": float("nan")}
            if cfg.val and (len(self.val_set) > 0):
                metrics = self.validate(eval_net, val_loader, m.nc, m.names)
            fitness = 0.1 * _nz(metrics["map50"]) + 0.9 * _nz(metrics["map50_95"])
            row = {"epoch": epoch + 1, **{f"train/{n}_loss": float(v) for n, v in zip(item_names, mloss.tolist())},
                   "metrics/mAP50": metrics["map50"], "metrics/mAP50-95": metrics["map50_95"],
                   "lr/pg0": float(opt.param_groups[0]["lr"])}
            history.append(row)
            _append_csv(csv_path, row)
            if cfg.verbose:
                log.info("libreyolo: epoch %d/%d  %s  mAP50 %.4f  mAP50-95 %.4f", epoch + 1, cfg.epochs,
                         "  ".join(f"{n} {v:.4f}" for n, v in zip(item_names, mloss.tolist())),
                         metrics["map50"], metrics["map50_95"])
            is_best = fitness > best_fitness
            best_fitness = max(best_fitness, fitness)
            ck = self._checkpoint(eval_net, net, opt, scaler, ema, epoch, best_fitness)
            save_checkpoint(ck, run_dir / "weights" / "last.pt")
            if is_best:
                save_checkpoint(ck, run_dir / "weights" / "best.pt")
            if cfg.plots:
                try:
                    from .plots import plot_results
                    plot_results(csv_path)
                except Exception as exc:  # a plot is never worth a failed run
                    log.warning("libreyolo: could not draw results.png: %s", exc)
        if seam is not None:
            m.set_train_seam(net, None)
        # the trained weights the Model keeps are the EMA's
        if ema is not None:
            net.load_state_dict(ema.ema.state_dict())
        net.eval()
        m.trained = True
        elapsed = time.time() - t_start
        final = history[-1] if history else {}
        return {"run_dir": str(run_dir), "epochs": len(history), "time_s": elapsed,
                "map50": final.get("metrics/mAP50"), "map50_95": final.get("metrics/mAP50-95"),
                "best_fitness": best_fitness, "history": history,
                "loss_names": list(item_names),
                "losses": [[h[f"train/{n}_loss"] for n in item_names] for h in history],
                "cuda_graph": runner.info() if seam is None else {**runner.info(), "seam": seam.info()}, "best": str(run_dir / "weights" / "best.pt"),
                "last": str(run_dir / "weights" / "last.pt")}

    def _checkpoint(self, eval_net, net, opt, scaler, ema, epoch, best_fitness) -> dict:
        m = self.model
        ck = m.checkpoint_of(eval_net)
        ck["train_state"] = {
            "model_raw": {k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
            "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
            "ema_updates": ema.updates if ema is not None else None,
            "epoch": epoch, "best_fitness": best_fitness,
            "args": {k: v for k, v in asdict(self.cfg).items() if isinstance(v, (int, float, str, bool))},
        }
        return ck


def _set_lr(group: dict, value: float) -> None:
    """Set a param group's lr; a tensor lr (captured whole steps read it) is updated in place."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value


def _nz(v: float) -> float:
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _append_csv(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
