"""Task-generic training loop: the task supplies the data, the evaluator and the fitness; the
family supplies the network and the loss; ``graphs/`` captures the step.

:meth:`Trainer.train` is set-up (seeding, data, network, loss, optimizer, EMA, resume, the
graph decision), then per epoch :meth:`Trainer.train_epoch` - each batch one :meth:`Trainer.step`,
the schedule's warm-up before it - and the end-of-epoch hooks in order: evaluation (the task's
evaluator on the EMA weights), logging (``results.csv``, the per-epoch line, ``results.png``) and
checkpoints (``last.pt`` with the training state for ``resume``, ``best.pt`` without it, both
written atomically). Features: SGD or AdamW with parameter groups (no decay on norms and biases),
warm-up then linear or cosine decay, gradient accumulation to a nominal batch, an exponential
moving average of the weights, AMP on CUDA.

With ``cuda_graph=True`` the step goes through :class:`libreyolo.graphs.training.TrainStepRunner`
(forward + loss + backward, and the whole step with the update where graph-safe) or, for families
with a seam, a :class:`~libreyolo.graphs.training.GraphedSegment`; anything that cannot be
captured logs one line and trains eager.
"""
from __future__ import annotations

import contextlib
import copy
import csv
import logging
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..device import select_device
from ..graphs.training import GraphedSegment, TrainStepRunner, prime_optimizer_state, training_state
from ..tasks import Task, TaskOptions, get_task
from .paths import next_run_dir

log = logging.getLogger("libreyolo")


@dataclass
class RunConfig:
    """What to train on and where the run goes."""

    data: str = "shapes"
    epochs: int = 100
    batch: int = 16
    imgsz: int = 640
    device: str = "auto"
    workers: int = 2
    val: bool = True
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    resume: Any = False             # True (the run's last.pt) or a path
    seed: int = 0
    plots: bool = True
    verbose: bool = True


@dataclass
class OptimConfig:
    """Optimizer, schedule, accumulation, EMA."""

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
    ema: bool = True


@dataclass
class GraphConfig:
    """How the step runs: CUDA graphs, mixed precision."""

    cuda_graph: bool = False
    amp: Any = True                 # True: float16 autocast + GradScaler; "bf16": bfloat16, no scaler (CUDA only)


_GROUPS = {"run": RunConfig, "optim": OptimConfig, "graph": GraphConfig}


class TrainConfig:
    """Training options in groups: ``run`` (:class:`RunConfig`), ``optim`` (:class:`OptimConfig`),
    ``graph`` (:class:`GraphConfig`) and ``task`` (the task's options dataclass, e.g.
    :class:`~libreyolo.tasks.detect.DetectOptions`: augmentation, validation thresholds).

    Built from flat keyword arguments (``TrainConfig(epochs=10, lr0=0.01, mosaic=0.5)``), each
    routed to its group; an unknown name is a TypeError listing the known ones. Reading a flat
    name (``cfg.lr0``) reads it from its group.
    """

    def __init__(self, task: str | Task = "detect", **kw: Any):
        task = get_task(task) if isinstance(task, str) else task
        known = {name: group for group, cls in _GROUPS.items() for name in (f.name for f in fields(cls))}
        task_names = task.Options.names()
        unknown = sorted(set(kw) - set(known) - task_names - {"extra"})
        if unknown:
            raise TypeError(f"unknown training option(s): {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(set(known) | task_names))}")
        split: dict[str, dict[str, Any]] = {g: {} for g in _GROUPS}
        for k, v in kw.items():
            if k in known:
                split[known[k]][k] = v
        self.run = RunConfig(**split["run"])
        self.optim = OptimConfig(**split["optim"])
        self.graph = GraphConfig(**split["graph"])
        self.task: TaskOptions = task.Options(**{k: v for k, v in kw.items() if k in task_names})
        self.extra: dict = dict(kw.get("extra") or {})

    @classmethod
    def from_kwargs(cls, task: str | Task = "detect", **kw: Any) -> "TrainConfig":
        return cls(task, **kw)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("run", "optim", "graph", "task", "extra"):
            raise AttributeError(name)
        for group in (self.run, self.optim, self.graph, self.task):
            if name in group.__dataclass_fields__:
                return getattr(group, name)
        raise AttributeError(f"TrainConfig has no option {name!r}")

    def as_dict(self) -> dict[str, Any]:
        """Every option, flat."""
        return {**asdict(self.run), **asdict(self.optim), **asdict(self.graph), **asdict(self.task)}


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


def check_config(cfg: TrainConfig, stride: int) -> None:
    """Validate every option once, before anything is loaded; canonical values in place. The
    image size is rounded up to the model's stride with one warning, as predict does."""
    from ..options import check_choice, check_float, check_fraction, check_imgsz, check_int, parse_amp, parse_bool
    r, o, g = cfg.run, cfg.optim, cfg.graph
    r.epochs = check_int("epochs", r.epochs, 1)
    r.batch = check_int("batch", r.batch, 1)
    r.imgsz = check_imgsz(r.imgsz, stride)
    r.workers = check_int("workers", r.workers, 0)
    r.seed = check_int("seed", r.seed)
    for name in ("val", "exist_ok", "plots", "verbose"):
        setattr(r, name, parse_bool(name, getattr(r, name)))
    if not (isinstance(r.resume, (str, Path)) and str(r.resume).lower() not in ("true", "false", "1", "0")):
        r.resume = parse_bool("resume", r.resume)
    o.optimizer = check_choice("optimizer", o.optimizer, ("SGD", "AdamW"))
    if o.lr0 is not None:
        o.lr0 = check_float("lr0", o.lr0, 0.0, min_inclusive=False)
    o.lrf = check_float("lrf", o.lrf, 0.0, 1.0)
    o.momentum = check_float("momentum", o.momentum, 0.0, 1.0, max_inclusive=False)
    o.weight_decay = check_float("weight_decay", o.weight_decay, 0.0)
    o.clip_grad = check_float("clip_grad", o.clip_grad, 0.0, min_inclusive=False)
    o.warmup_epochs = check_float("warmup_epochs", o.warmup_epochs, 0.0)
    o.warmup_momentum = check_fraction("warmup_momentum", o.warmup_momentum)
    o.warmup_bias_lr = check_float("warmup_bias_lr", o.warmup_bias_lr, 0.0)
    o.nbs = check_int("nbs", o.nbs, 1)
    o.cos_lr, o.ema = parse_bool("cos_lr", o.cos_lr), parse_bool("ema", o.ema)
    g.cuda_graph = parse_bool("cuda_graph", g.cuda_graph)
    parse_amp(g.amp)   # validated here; resolved against the device by the trainer
    cfg.task.check()


class Trainer:
    """Trains ``model`` (a libreyolo Model) according to a :class:`TrainConfig`."""

    def __init__(self, model, cfg: TrainConfig):
        check_config(cfg, model.STRIDE)
        self.model = model
        self.task: Task = model.task
        self.cfg = cfg
        self.device = select_device(cfg.run.device) if cfg.run.device != "auto" else model.device
        self.model.to(self.device)
        from ..options import parse_amp
        self.amp_dtype = parse_amp(cfg.graph.amp, model.AMP_DTYPE) if self.device.type == "cuda" else None
        self.amp = self.amp_dtype is not None
        self.hooks = [EvaluationHook(), LoggingHook(), CheckpointHook()]

    # ------------------------------------------------------------------ data
    def _loaders(self, data):
        cfg = self.cfg
        self.train_set, self.val_set, collate = self.task.datasets(data, cfg.run.imgsz, self.model, cfg.task)
        # One generator, re-seeded at every epoch (seed + epoch): the shuffle order and the
        # workers' augmentation seeds of epoch e are the same in a resumed run.
        self.loader_gen = torch.Generator().manual_seed(cfg.run.seed)
        pin = self.device.type == "cuda"
        workers = max(0, int(cfg.run.workers))
        common = dict(num_workers=workers, pin_memory=pin, collate_fn=collate)
        batch = cfg.run.batch
        train = torch.utils.data.DataLoader(self.train_set, batch_size=batch, shuffle=True,
                                            generator=self.loader_gen,
                                            drop_last=len(self.train_set) > batch, **common)
        val = torch.utils.data.DataLoader(self.val_set, batch_size=batch, shuffle=False, **common)
        return train, val

    # ------------------------------------------------------------------ validate
    @torch.no_grad()
    def validate(self, net: nn.Module, loader, progress: bool = False, loss_fn: nn.Module | None = None) -> dict:
        """The task's metrics of ``net`` on ``loader`` (eval mode, the AMP of the run).

        With ``loss_fn`` (training's loss module) it also computes the validation loss: the same
        loss as training on each batch's training-format outputs of the evaluated weights (see
        ``Model.val_loss_outputs``; normalization and dropout in eval mode, no gradients),
        averaged over the images, left in ``self.val_loss`` (a CPU tensor named like the
        loss's ``item_names``). The metrics are the same with or without it.
        """
        was_training = net.training
        net.eval()
        m = self.model
        infer = m.infer_with(net)
        prep = m.preprocess
        evaluator = self.last_evaluator = self.task.evaluator(m, self.cfg.task)
        evaluator.reset()
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(loader), desc="  validate", unit="batch", leave=False)
        recorded: list = []
        hook = net.register_forward_hook(lambda _m, _i, o: recorded.append(o)) if loss_fn is not None else None
        total, images = None, 0
        # the loss's own randomness (DETR denoising queries) from a fixed seed: the same batches
        # give the same validation loss, and training's random stream is left as it was
        rng = contextlib.nullcontext()
        if loss_fn is not None:
            rng = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
        try:
            with rng:
                if loss_fn is not None:
                    torch.manual_seed(self.cfg.run.seed)
                for batch in loader:
                    x = prep.normalize(batch[0].to(self.device, non_blocking=True).float().div_(255))
                    with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float16, enabled=self.amp):
                        recorded.clear()
                        out = infer(x)
                        if loss_fn is not None:
                            targets = [t.to(self.device, non_blocking=True) for t in batch[1:]]
                            _, items = loss_fn(m.val_loss_outputs(net, recorded[-1], x, *targets), *targets)
                    if loss_fn is not None:
                        items = items.detach().float() * x.shape[0]
                        total = items if total is None else total + items
                        images += x.shape[0]
                    evaluator.process(out, batch)
                    if bar is not None:
                        bar.update(1)
        finally:
            if hook is not None:
                hook.remove()
            if bar is not None:
                bar.close()
            net.train(was_training)
        if loss_fn is not None:
            self.val_loss = (total / max(images, 1)).cpu() if total is not None else None
        return evaluator.evaluate()

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        """Seeds, data, network, loss, optimizer, EMA, resume state, run folder, step runner."""
        from ..weights import load_checkpoint
        cfg, m = self.cfg, self.model
        run, opt_cfg = cfg.run, cfg.optim
        torch.manual_seed(run.seed)
        np.random.seed(run.seed)
        data = self.task.resolve_data(run.data)
        if data.nc != m.nc:
            log.info("libreyolo: dataset has %d classes, model %d: rebuilding the head for %d classes",
                     data.nc, m.nc, data.nc)
            m.reset_classes(data.nc, data.names)
        else:
            m.names = dict(data.names)
        m.imgsz = run.imgsz
        net = self.net = m.model
        if not m.trained and not run.resume:
            m.init_for_training(net)   # the original recipes' prior bias on class/objectness logits
        net.to(self.device).train()
        self.loss_fn = m.build_loss().to(self.device)
        # a separate instance for the validation loss: the training step's may be captured in a graph
        self.val_loss_fn = m.build_loss().to(self.device) if run.val else None
        self.item_names = tuple(self.loss_fn.item_names)  # the loss contract: see Model.build_loss
        self.train_loader, self.val_loader = self._loaders(data)
        self.nb = len(self.train_loader)
        self.accumulate = max(round(opt_cfg.nbs / run.batch), 1)
        if opt_cfg.lr0 is None:
            opt_cfg.lr0 = 0.001 if opt_cfg.optimizer.lower() == "adamw" else 0.01
        wd = opt_cfg.weight_decay * run.batch * self.accumulate / opt_cfg.nbs
        # A whole training step (optimizer included) can be captured only with a fused SGD or
        # AdamW whose lr is a device tensor (updated in place by the schedule) and no GradScaler.
        name = opt_cfg.optimizer.lower()
        if name not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be SGD or AdamW, got {opt_cfg.optimizer!r}")
        self.whole_step = (bool(cfg.graph.cuda_graph) and m.SUPPORTS_CUDA_GRAPH_TRAIN and name in m.WHOLE_STEP_OPTIMIZERS
                           and self.device.type == "cuda" and self.amp_dtype != torch.float16)
        groups = _param_groups(net, wd)
        if self.whole_step:
            for g in groups:
                g["lr"] = torch.tensor(opt_cfg.lr0, device=self.device)
        fused = True if self.whole_step else None
        if name == "adamw":
            # capturable: AdamW refuses to be captured without it (it keeps its step on the device)
            opt = torch.optim.AdamW(groups, lr=opt_cfg.lr0, betas=(opt_cfg.momentum, 0.999), fused=fused,
                                    capturable=bool(self.whole_step))
        else:
            opt = torch.optim.SGD(groups, lr=opt_cfg.lr0, momentum=opt_cfg.momentum, nesterov=True, fused=fused)
        for g in opt.param_groups:
            g["initial_lr"] = opt_cfg.lr0
        self.opt = opt
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        self.ema = ModelEMA(net) if opt_cfg.ema else None

        self.run_dir, self.start_epoch, self.best_fitness = None, 0, -1.0
        if run.resume:
            last = Path(run.resume) if isinstance(run.resume, (str, Path)) and run.resume is not True \
                else Path(run.project) / run.name / "weights" / "last.pt"
            ck = load_checkpoint(last)
            st = ck.get("train_state")
            if not st:
                raise ValueError(f"{last} has no training state to resume from")
            net.load_state_dict(st["model_raw"])
            opt.load_state_dict(st["optimizer"])
            if self.whole_step:  # a loaded tensor lr comes back on the CPU
                for g in opt.param_groups:
                    g["lr"] = torch.tensor(float(g["lr"]), device=self.device)
            self.scaler.load_state_dict(st["scaler"])
            if self.ema is not None and st.get("ema_updates") is not None:
                self.ema.ema.load_state_dict(ck["model"])
                self.ema.updates = int(st["ema_updates"])
            self.start_epoch, self.best_fitness = int(st["epoch"]) + 1, float(st["best_fitness"])
            self.run_dir = last.parent.parent
            log.info("libreyolo: resuming %s from epoch %d", self.run_dir, self.start_epoch + 1)
        if self.run_dir is None:
            self.run_dir = next_run_dir(run.project, run.name, run.exist_ok)
        (self.run_dir / "weights").mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / "results.csv"
        self._setup_runner()

    def _setup_runner(self) -> None:
        """The step (forward, loss, backward), the update, and how they run: graphed or eager."""
        cfg, m, net = self.cfg, self.model, self.net
        amp_dtype, loss_fn, prep = self.amp_dtype, self.loss_fn, m.preprocess
        scaler, opt, ema = self.scaler, self.opt, self.ema

        def step(x, *targets):
            # no autocast weight cache: a captured graph must not record casts the cache frees later
            with torch.autocast(self.device.type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None,
                                cache_enabled=False):
                outputs = m.train_forward(net, prep.normalize(x), *targets)
                loss, items = loss_fn(outputs, *targets)
            scaler.scale(loss).backward()
            return loss.detach(), items.detach()

        params = [p for p in net.parameters() if p.requires_grad]

        def optimizer_step() -> None:
            if scaler.is_enabled():
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, max_norm=cfg.optim.clip_grad, foreach=True)
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
        self.seam = None
        if (cfg.graph.cuda_graph and self.device.type == "cuda" and not m.SUPPORTS_CUDA_GRAPH_TRAIN
                and m.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM):
            front = m.train_seam(net)
            if front is not None:
                self.seam = GraphedSegment(front, name=f"{m.FAMILY} backbone+encoder")
                m.set_train_seam(net, self.seam)
                log.info("libreyolo: training %s with its backbone+encoder in CUDA graphs (forward and "
                         "backward); decoder, matching and loss eager", m.FAMILY)
        self.optimizer_step = optimizer_step
        self.step_runner = TrainStepRunner(net, step, enabled=bool(cfg.graph.cuda_graph) and self.seam is None,
                                           family=m.FAMILY, supported=m.SUPPORTS_CUDA_GRAPH_TRAIN,
                                           update=optimizer_step, state=mutable_state)

    # ------------------------------------------------------------------ schedule
    def lr_factor(self, epoch: float) -> float:
        """The learning rate's factor at ``epoch`` (linear or cosine from 1 to ``lrf``)."""
        o = self.cfg.optim
        x = epoch / max(1, self.cfg.run.epochs)
        if o.cos_lr:
            return ((1 - math.cos(x * math.pi)) / 2) * (o.lrf - 1) + 1
        return (1 - x) * (1.0 - o.lrf) + o.lrf

    def warmup(self, ni: int, epoch: int) -> None:
        """Before batch ``ni`` of the warm-up: accumulation, learning rates and momentum ramp up."""
        o, nw = self.cfg.optim, self.nw
        if not (nw > 0 and ni <= nw):
            return
        xi = [0, nw]
        self.accumulate = max(1, round(float(np.interp(ni, xi, [1, o.nbs / self.cfg.run.batch]))))
        for j, g in enumerate(self.opt.param_groups):
            start = o.warmup_bias_lr if j == 2 else 0.0
            _set_lr(g, float(np.interp(ni, xi, [start, g["initial_lr"] * self.lr_factor(epoch)])))
            if "momentum" in g:
                g["momentum"] = float(np.interp(ni, xi, [o.warmup_momentum, o.momentum]))

    # ------------------------------------------------------------------ loop
    def step(self, ni: int, batch) -> torch.Tensor:
        """One batch: forward, loss, backward and - once ``accumulate`` batches are in - the
        update, graphed where the runner can. Returns the loss items (host)."""
        imgs, *targets = batch
        x = imgs.to(self.device, non_blocking=True).float().div_(255)
        targets = [t.to(self.device, non_blocking=True) for t in targets]
        update_now = ni - self.last_opt_step >= self.accumulate
        runner = self.step_runner
        if self.whole_step and update_now and ni > self.nw:  # micro-batches replay the fwd+bwd graph
            _, items = runner(x, *targets, whole=True)  # update included
            self.last_opt_step = ni
        else:
            _, items = runner(x, *targets)
            if update_now:
                self.optimizer_step()
                self.last_opt_step = ni
        self.last_batch = (x, targets)
        return items.float().cpu()

    def train_epoch(self, epoch: int) -> torch.Tensor:
        """One epoch over the training set; returns the mean loss items."""
        cfg, nb = self.cfg, self.nb
        self.loader_gen.manual_seed(cfg.run.seed + epoch)
        torch.manual_seed(cfg.run.seed + epoch)
        np.random.seed((cfg.run.seed + epoch) % 2**32)
        self.net.train()
        mloss = torch.zeros(len(self.item_names))
        progress = None
        if cfg.run.verbose:
            from tqdm import tqdm
            progress = tqdm(total=nb, desc=f"epoch {epoch + 1}/{cfg.run.epochs}", unit="batch", leave=True)
        for i, batch in enumerate(self.train_loader):
            ni = i + nb * epoch
            self.warmup(ni, epoch)
            items = self.step(ni, batch)
            if not torch.isfinite(items).all():
                raise FloatingPointError(f"non-finite loss at epoch {epoch + 1} batch {i}: {items.tolist()}")
            mloss = (mloss * i + items) / (i + 1)
            if progress is not None:
                x, targets = self.last_batch
                post = {n: f"{v:.3f}" for n, v in zip(self.item_names, mloss.tolist())}
                post.update(self.task_postfix(targets), size=x.shape[-1])
                progress.set_postfix(post)
                progress.update(1)
        if progress is not None:
            progress.close()
        if self.last_opt_step < nb * (epoch + 1) - 1:
            # flush gradients still accumulating, so an epoch is self-contained and a
            # resumed run continues exactly where the interrupted one stopped
            self.optimizer_step()
            self.last_opt_step = nb * (epoch + 1) - 1
        for g in self.opt.param_groups:
            _set_lr(g, g["initial_lr"] * self.lr_factor(epoch + 1))
        return mloss

    @staticmethod
    def task_postfix(targets) -> dict:
        """Progress-bar fields of the batch's targets (detection: instances)."""
        if len(targets) == 2 and targets[1].dtype == torch.bool:
            return {"inst": int(targets[1].sum())}
        return {}

    def _phase(self, epoch: int) -> None:
        """Before an epoch: phase changes that alter what the step computes release its graphs."""
        why = self.task.on_epoch(self.train_set, epoch, self.cfg.run.epochs, self.cfg.task)
        if why:
            self.step_runner.release(why)
            log.info("libreyolo: %s", why)
        on_epoch = getattr(self.loss_fn, "on_epoch", None)
        if on_epoch is not None and on_epoch(epoch, self.cfg.run.epochs):
            # the loss computes something else from now on: graphs of the old loss are stale
            self.step_runner.release(f"{type(self.loss_fn).__name__} changed at epoch {epoch + 1}")
        if self.val_loss_fn is not None and hasattr(self.val_loss_fn, "on_epoch"):
            self.val_loss_fn.on_epoch(epoch, self.cfg.run.epochs)   # the validation loss follows it

    def train(self) -> dict:
        self._setup()
        cfg = self.cfg
        self.nw = max(round(cfg.optim.warmup_epochs * self.nb), 1) if cfg.optim.warmup_epochs > 0 else 0
        self.last_opt_step = self.nb * self.start_epoch - 1
        self.history: list[dict] = []
        self.opt.zero_grad(set_to_none=False)
        t_start = time.time()
        for hook in self.hooks:
            hook.on_train_start(self)
        try:
            for epoch in range(self.start_epoch, cfg.run.epochs):
                t_epoch = time.time()
                self._phase(epoch)
                mloss = self.train_epoch(epoch)
                state = {"epoch": epoch, "mloss": mloss, "time_s": time.time() - t_epoch}
                for hook in self.hooks:
                    hook.on_epoch_end(self, state)
        finally:
            for hook in self.hooks:
                hook.on_train_end(self)
        if self.seam is not None:
            self.model.set_train_seam(self.net, None)
        # the trained weights the Model keeps are the EMA's
        if self.ema is not None:
            self.net.load_state_dict(self.ema.ema.state_dict())
        self.net.eval()
        self.model.trained = True
        final = self.history[-1] if self.history else {}
        item_names = self.item_names
        runner, seam = self.step_runner, self.seam
        best = self.best_metrics or {}
        return {"run_dir": str(self.run_dir), "epochs": len(self.history), "time_s": time.time() - t_start,
                **{k: final.get(k) for k in self.metric_keys}, "best_metrics": best,
                "best_epoch": self.best_epoch, "best_fitness": self.best_fitness, "history": self.history,
                "loss_names": list(item_names),
                "losses": [[h[f"train/{n}_loss"] for n in item_names] for h in self.history],
                "cuda_graph": runner.info() if seam is None else {**runner.info(), "seam": seam.info()},
                "best": str(self.run_dir / "weights" / "best.pt"), "last": str(self.run_dir / "weights" / "last.pt")}

    @property
    def eval_net(self) -> nn.Module:
        return self.ema.ema if self.ema is not None else self.net

    def checkpoint(self, epoch: int, with_state: bool) -> dict:
        """The LibreYOLO checkpoint of the EMA weights; ``with_state`` adds what ``resume`` needs
        (raw weights, optimizer, scaler, EMA count, epoch): ``last.pt`` only."""
        ck = self.model.checkpoint_of(self.eval_net)
        ck["train_metrics"] = self.epoch_metrics
        if with_state:
            ck["train_state"] = {
                "model_raw": {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()},
                "optimizer": self.opt.state_dict(), "scaler": self.scaler.state_dict(),
                "ema_updates": self.ema.updates if self.ema is not None else None,
                "epoch": epoch, "best_fitness": self.best_fitness,
                "args": {k: v for k, v in self.cfg.as_dict().items() if isinstance(v, (int, float, str, bool))},
            }
        return ck


class Hook:
    """Something done around the epochs (see :meth:`Trainer.train`); hooks run in list order."""

    def on_train_start(self, t: Trainer) -> None:
        pass

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
        pass

    def on_train_end(self, t: Trainer) -> None:
        pass


class EvaluationHook(Hook):
    """The task's metrics of the EMA weights on the validation split; fitness and best epoch."""

    def on_train_start(self, t: Trainer) -> None:
        t.best_metrics, t.best_epoch, t.epoch_metrics = None, None, {}
        t.metric_keys = list(t.task.empty_metrics())

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
        metrics = t.task.empty_metrics()
        t.val_loss = None
        if t.cfg.run.val and len(t.val_set) > 0:
            metrics = t.validate(t.eval_net, t.val_loader, progress=t.cfg.run.verbose, loss_fn=t.val_loss_fn)
        fitness = t.task.fitness(metrics)
        state["metrics"], state["is_best"] = metrics, fitness > t.best_fitness
        t.best_fitness = max(t.best_fitness, fitness)
        t.epoch_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if state["is_best"]:
            t.best_metrics, t.best_epoch = dict(t.epoch_metrics), state["epoch"] + 1


class LoggingHook(Hook):
    """``results.csv``, the per-epoch log line, ``results.png``.

    With ``verbose`` the line reaches the user even where logging is not configured (the Python
    API): a handler is attached to the ``libreyolo`` logger for the run when it has none and the
    root logger has none either.
    """

    def on_train_start(self, t: Trainer) -> None:
        self._handler = None
        root, lib = logging.getLogger(), logging.getLogger("libreyolo")
        if t.cfg.run.verbose and not lib.handlers and not root.handlers:
            self._handler = logging.StreamHandler()
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            lib.addHandler(self._handler)
            self._level = lib.level
            if lib.getEffectiveLevel() > logging.INFO:
                lib.setLevel(logging.INFO)

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
        epoch, mloss, metrics = state["epoch"], state["mloss"], state["metrics"]
        vloss = t.val_loss.tolist() if t.val_loss is not None else [float("nan")] * len(t.item_names)
        row = {"epoch": epoch + 1, **{f"train/{n}_loss": float(v) for n, v in zip(t.item_names, mloss.tolist())},
               **{f"val/{n}_loss": float(v) for n, v in zip(t.item_names, vloss)},
               **t.task.metric_columns(metrics), "lr/pg0": float(t.opt.param_groups[0]["lr"]),
               "time/epoch_s": round(state["time_s"], 3)}
        row.update({k: metrics[k] for k in t.metric_keys if k in metrics})
        t.history.append(row)
        _append_csv(t.csv_path, {k: v for k, v in row.items() if k not in t.metric_keys})
        if t.cfg.run.verbose:
            log.info("libreyolo: epoch %d/%d  %s  %s  (%.1f s)", epoch + 1, t.cfg.run.epochs,
                     "  ".join(f"{n} {v:.4f}" for n, v in zip(t.item_names, mloss.tolist())),
                     t.task.summary(metrics), state["time_s"])
        if t.cfg.run.plots:
            try:
                from .plots import plot_results
                plot_results(t.csv_path)
            except Exception as exc:  # a plot is never worth a failed run
                log.warning("libreyolo: could not draw results.png: %s", exc)

    def on_train_end(self, t: Trainer) -> None:
        evaluator = getattr(t, "last_evaluator", None)
        if t.cfg.run.plots and evaluator is not None and t.history:
            try:   # the last epoch's validation: PR curves, confusion matrix, a validation batch
                evaluator.plot(t.run_dir)
            except Exception as exc:  # a plot is never worth a failed run
                log.warning("libreyolo: could not draw the validation plots: %s", exc)
        if self._handler is not None:
            lib = logging.getLogger("libreyolo")
            lib.removeHandler(self._handler)
            lib.setLevel(self._level)
            self._handler = None


class CheckpointHook(Hook):
    """``last.pt`` every epoch (with the training state, for ``resume``), ``best.pt`` when the
    fitness improved (weights and metadata only: a third of the size)."""

    def on_epoch_end(self, t: Trainer, state: dict) -> None:
        from ..weights import save_checkpoint
        epoch = state["epoch"]
        save_checkpoint(t.checkpoint(epoch, with_state=True), t.run_dir / "weights" / "last.pt")
        if state["is_best"]:
            save_checkpoint(t.checkpoint(epoch, with_state=False), t.run_dir / "weights" / "best.pt")


def _set_lr(group: dict, value: float) -> None:
    """Set a param group's lr; a tensor lr (captured whole steps read it) is updated in place."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value


def _append_csv(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
