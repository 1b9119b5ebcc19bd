"""Task-generic training loop: the task supplies the data, the evaluator and the fitness; the
family supplies the network and the loss; ``graphs/`` captures the step.

:meth:`Trainer.train` is set-up (seeding, data, network, loss, optimizer, EMA, resume, the
graph decision), then per epoch :meth:`Trainer.train_epoch` - each batch one :meth:`Trainer.step`,
the schedule's warm-up before it - and the end-of-epoch hooks in order: evaluation (the task's
evaluator on the EMA weights), logging (``results.csv``, the per-epoch line, ``results.png``) and
checkpoints (``last.pt`` with the training state for ``resume``, ``best.pt`` without it, both
written atomically). The loop keeps the device busy: a step's loss is read one step late
(:class:`LossFold`, no host sync per step), and the next epoch's loader is started before the
end-of-epoch hooks (:meth:`Trainer._prepare_epoch`), so its first batches load during validation.
Features: SGD or AdamW with parameter groups (no decay on norms and biases), warm-up then linear
or cosine decay, gradient accumulation to a nominal batch, an exponential moving average of the
weights, AMP on CUDA.

With ``cuda_graph=True`` the step goes through :class:`libreyolo.graphs.training.TrainStepRunner`
(forward + loss + backward, and the whole step with the update where graph-safe) or, for families
with a seam, a :class:`~libreyolo.graphs.training.GraphedSegment`; anything that cannot be
captured logs one line and trains eager.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..device import select_device
from ..distributed import (Distributed, GradientReducer, convert_sync_batchnorm, launched, local_device, loss_share,
                           parse_devices, reduction_of, revert_sync_batchnorm)
from ..graphs.training import (GraphedSegment, TrainStepRunner, backward_into_grads, prime_optimizer_state,
                               scaler_tensors, training_state)
from ..tasks import Task
from .background import frozen_heap
from .config import TrainConfig
from .hooks import CheckpointHook, EvaluationHook
from .loaders import MAX_WORKERS, WorkerDeathSignal, build_loaders, worker_died
from .loggers import LoggingHook, TensorBoardHook
from .optim import ModelEMA, freeze, freeze_prefixes, match_state_layouts, param_groups, set_lr
from .paths import next_run_dir
from .runs import RunFolderBusy, RunLock, TrainingDiverged, TrainingError, TrainingInterrupted
from .step import LossFold

#: the errors that stop a run, importable from here (where users catch them)
__all__ = ["Trainer", "TrainConfig", "TrainingError", "TrainingDiverged", "RunFolderBusy", "TrainingInterrupted",
           "timing_line"]

log = logging.getLogger(__name__)


def timing_line(timing: dict) -> str:
    """One line of where a run's wall went (:attr:`Trainer.timing`, seconds)."""
    total = sum(timing[k] for k in ("setup_s", "train_s", "val_s", "ckpt_wait_s", "between_s", "end_s"))

    def parts(key: str) -> str:   # the parts of a figure, largest first, those of 0.05 s and more
        named = sorted(((v, k[:-4].lower() if k.endswith("Hook") else k) for k, v in timing.get(key, {}).items()
                        if v >= 0.05), reverse=True)
        return f" ({', '.join(f'{k} {v:.1f}' for v, k in named)})" if named else ""

    vp = timing.get("val_parts", {})
    names = (("host", "host part"), ("stage", "device stage"), ("loss", "device loss"), ("loader", "loader"))
    val = "".join(f", {name} {vp[k]:.1f}" for k, name in names if vp.get(k, 0.0) >= 0.05)
    return (f"{total:.1f} s in train(): set-up {timing['setup_s']:.1f}, epochs {timing['train_s']:.1f}, "
            f"validation {timing['val_s']:.1f} (evaluation {timing['eval_s']:.1f}{val}), waiting for checkpoint "
            f"writes {timing['ckpt_wait_s']:.1f}, the rest of the epochs' ends {timing['between_s']:.1f}"
            f"{parts('between_parts')}, end {timing['end_s']:.1f}{parts('end_parts')}")


def check_config(cfg: TrainConfig, stride: int) -> None:
    """Validate every option once, before anything is loaded; canonical values in place. The
    image size is rounded up to the model's stride with one warning, as predict does."""
    from ..options import (OptionError, check_choice, check_float, check_fraction, check_imgsz, check_int, check_seed,
                           parse_amp, parse_bool, parse_cache, parse_freeze, parse_loggers)
    r, o, g = cfg.run, cfg.optim, cfg.graph
    r.epochs = check_int("epochs", r.epochs, 1)
    r.batch = check_int("batch", r.batch, 1)
    r.imgsz = check_imgsz(r.imgsz, stride)
    r.cache = parse_cache(r.cache)
    if r.workers is not None:
        r.workers = check_int("workers", r.workers, 0, MAX_WORKERS)
    r.seed = check_seed(r.seed)
    for name in ("val", "exist_ok", "plots", "verbose"):
        setattr(r, name, parse_bool(name, getattr(r, name)))
    r.patience = check_int("patience", r.patience, 0)
    r.save_period = check_int("save_period", r.save_period, 0)
    r.nan_patience = check_int("nan_patience", r.nan_patience, 1)
    r.freeze = parse_freeze(r.freeze)
    r.loggers = parse_loggers(r.loggers)
    r.sync_bn = parse_bool("sync_bn", r.sync_bn)
    r.ddp_timeout = check_float("ddp_timeout", r.ddp_timeout, 0.0, min_inclusive=False)
    if r.patience and not r.val:
        raise OptionError(f"patience={r.patience} needs validation: early stopping follows the validation "
                          "metric, and val=False turns validation off")
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
    if g.channels_last is not None:
        g.channels_last = parse_bool("channels_last", g.channels_last)
    cfg.task.check()


class Trainer:
    """Trains ``model`` (a libreyolo Model) according to a :class:`TrainConfig`."""

    def __init__(self, model, cfg: TrainConfig):
        check_config(cfg, model.STRIDE)
        self.model = model
        self.task: Task = model.task
        self.cfg = cfg
        self.dist: Distributed | None = None   # joined in _setup (train only): see libreyolo.distributed
        if launched() or parse_devices(cfg.run.device) is not None:
            self.device = select_device(local_device(cfg.run.device))   # this rank's device
        else:
            self.device = select_device(cfg.run.device) if cfg.run.device != "auto" else model.device
        self.model.to(self.device)
        from ..options import parse_amp
        self.amp_dtype = parse_amp(cfg.graph.amp, model.AMP_DTYPE) if self.device.type == "cuda" else None
        self.amp = self.amp_dtype is not None
        cl = cfg.graph.channels_last
        self.channels_last = bool(model.CHANNELS_LAST and self.device.type == "cuda") if cl is None else cl
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        self.frozen_params: list[nn.Parameter] = []   # what freeze= turned off, on again after the run
        self.device_augment = None   # the task's per-batch augmentation on the device (gpu_augment), set up with the data
        self.hooks = [EvaluationHook(), LoggingHook(), CheckpointHook()]
        if "tensorboard" in cfg.run.loggers:   # before the checkpoints, whose end may raise a write's error
            self.hooks.insert(2, TensorBoardHook())

    # ------------------------------------------------------------------ data
    def _loaders(self, data):
        """The run's loaders (:func:`~libreyolo.engine.loaders.build_loaders`), their datasets and
        the per-epoch state the loop keeps for them."""
        ld = build_loaders(self.task, data, self.model, self.cfg, self.device, self.dist)
        self.train_set, self.val_set, self.epoch_seeded = ld.train_set, ld.val_set, ld.epoch_seeded
        self.train_sampler, self.loader_gen, self.worker_cap_note = ld.sampler, ld.generator, ld.cap_note
        self._loader_started = False   # a persistent loader draws its workers' base seed once, when it starts
        self._prepared = None   # (epoch, its loader iterator, the task's phase change): see _prepare_epoch
        self._worker_signal = WorkerDeathSignal()
        return ld.train, ld.val

    # ------------------------------------------------------------------ validate
    #: how validation graphs are captured (None: CUDA graphs); tests pass a CPU stand-in
    val_capturer: Any = None

    def _validation_stage(self, net: nn.Module, loader):
        """The :class:`~libreyolo.engine.valgraph.ValidationStage` for ``net`` (kept across epochs,
        so its graph is captured once per run): graphed when ``cuda_graph`` is on and the family
        is capturable, eager otherwise; the batch fixed at the loader's (or the split's size)."""
        from .valgraph import ValidationStage, graph_validation
        batch = min(int(loader.batch_size or 1), max(1, len(loader.dataset)))
        stage = getattr(self, "_val_stage", None)
        if stage is None or stage.net is not net or stage.batch != batch:
            graphs, why = graph_validation(self.model, self.cfg.graph.cuda_graph, self.device, self.val_capturer)
            if graphs:
                log.info("libreyolo: validating %s through a captured stage (batch %d)", self.model.FAMILY, batch)
            elif self.cfg.graph.cuda_graph:
                log.info("libreyolo: validating %s eager: %s", self.model.FAMILY, why)
            stage = self._val_stage = ValidationStage(self.model, net, batch, graphs, self.val_capturer)
        return stage

    @torch.no_grad()
    def validate(self, net: nn.Module, loader, progress: bool = False, loss_fn: nn.Module | None = None) -> dict:
        """The task's metrics of ``net`` on ``loader`` (eval mode, the AMP of the run).

        Each batch goes through validation's stage (:mod:`libreyolo.engine.valgraph`): the
        network and the evaluator's device part on fixed-shape batches (a last partial batch
        padded), replayed from a CUDA graph with ``cuda_graph=True`` on a capturable family -
        the same numbers as eager, bit for bit - then the evaluator's host part.

        With ``loss_fn`` (training's loss module) it also computes the validation loss: the same
        loss as training on each batch's training-format outputs of the evaluated weights (see
        ``Model.val_loss_outputs``; normalization and dropout in eval mode, no gradients),
        averaged over the images, left in ``self.val_loss`` (a CPU tensor named like the
        loss's ``item_names``). The metrics are the same with or without it.
        """
        was_training = net.training
        net.eval()
        m = self.model
        prep = m.preprocess
        stage = self._validation_stage(net, loader)
        evaluator = self.last_evaluator = self.task.evaluator(m, self.cfg.task)
        evaluator.pool = getattr(self, "eval_pool", None)
        evaluator.reset()
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(loader), desc="  validate", unit="batch", leave=False)
        hook = net.register_forward_hook(stage.record) if loss_fn is not None else None
        total, images = None, 0
        # where validation's time goes (seconds): waiting for the loader, the evaluator's host part
        # (detection: host NMS or the copy of the device's, waiting for the stage), the device time of the
        # stage and of the validation loss (CUDA events, read once at the end: no added sync)
        parts = {"loader": 0.0, "host": 0.0, "stage": 0.0, "loss": 0.0}
        spans: list[tuple[Any, Any, Any]] = []
        cuda = self.device.type == "cuda"
        # the events go on the run's device's current stream (not the current device's: see LossFold)
        stream = torch.cuda.current_stream(self.device) if cuda else None

        def mark() -> Any:
            if cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record(stream)
                return ev
            return time.perf_counter()
        # the loss's own randomness (DETR denoising queries) from a fixed seed: the same batches
        # give the same validation loss, and training's random stream is left as it was
        rng = contextlib.nullcontext()
        if loss_fn is not None:
            rng = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
        try:
            with rng:
                if loss_fn is not None:
                    torch.manual_seed(self.cfg.run.seed)
                t_wait = time.perf_counter()
                # the iterator the epoch's last step started (_prefetch_validation), if it is this
                # loader's: a second iter() of a persistent loader would reset its workers' work
                prefetched, self._val_batches = getattr(self, "_val_batches", None), None
                batches = prefetched[1] if prefetched is not None and prefetched[0] is loader else loader
                for batch in batches:
                    parts["loader"] += time.perf_counter() - t_wait
                    x = batch[0].to(self.device, non_blocking=True).float().div_(255)
                    x = prep.normalize(x.contiguous(memory_format=self.memory_format))
                    m0 = mark()
                    with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float16, enabled=self.amp):
                        out, raw = stage(x, evaluator, with_raw=loss_fn is not None)
                        m1 = mark()
                        if loss_fn is not None:
                            targets = [t.to(self.device, non_blocking=True) for t in batch[1:]]
                            _, items = loss_fn(m.val_loss_outputs(net, raw, x, *targets), *targets)
                    if loss_fn is not None:
                        items = items.detach().float() * x.shape[0]
                        total = items if total is None else total + items
                        images += x.shape[0]
                    spans.append((m0, m1, mark()))
                    t_host = time.perf_counter()
                    evaluator.process(out, batch)
                    parts["host"] += time.perf_counter() - t_host
                    if bar is not None:
                        bar.update(1)
                    t_wait = time.perf_counter()
        finally:
            if hook is not None:
                hook.remove()
            stage.recorded.clear()
            if bar is not None:
                bar.close()
            net.train(was_training)
        if loss_fn is not None:
            self.val_loss = (total / max(images, 1)).cpu() if total is not None else None
        if cuda and spans:
            spans[-1][2].synchronize()
        for a, b, c in spans:
            if cuda:
                parts["stage"] += a.elapsed_time(b) / 1e3
                parts["loss"] += b.elapsed_time(c) / 1e3
            else:
                parts["stage"] += b - a
                parts["loss"] += c - b
        self.val_parts = parts
        t0 = time.perf_counter()
        metrics = evaluator.evaluate()
        self.val_eval_s = time.perf_counter() - t0
        return metrics

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        """Seeds, data, network, loss, optimizer, EMA, resume state, run folder, step runner."""
        from ..weights import load_checkpoint
        cfg, m = self.cfg, self.model
        run, opt_cfg = cfg.run, cfg.optim
        self.dist = Distributed.setup(run.device, run.ddp_timeout)
        if self.dist is not None:
            self.device = self.dist.device
            self.dist.local_batch(run.batch)   # a batch that does not divide fails before any work
            if not self.dist.is_main:
                run.verbose = False   # rank 0 alone reports progress
        if run.sync_bn:
            if self.dist is None or self.device.type != "cuda":
                from ..options import OptionError
                raise OptionError("sync_bn=True synchronizes BatchNorm across the GPUs of a distributed run "
                                  "(device=0,1 or torchrun); torch's SyncBatchNorm runs on CUDA only")
        self.run_dir = None
        if self.dist is None or self.dist.is_main:   # rank 0 alone writes the run folder
            self._claim_run_dir()   # before any work: a folder in use fails at once
        torch.manual_seed(run.seed)
        np.random.seed(run.seed)
        if self.dist is not None:   # rank 0 first: a built-in set is generated once, not per rank
            data = self.dist.main_first(lambda: self.task.resolve_data(run.data), f"prepare data={run.data!r}")
        else:
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
        net.to(self.device, memory_format=self.memory_format).train()
        if self.dist is not None:
            self.dist.broadcast_module(net)   # every rank starts from rank 0's weights
            if run.sync_bn:   # in place: the same parameter and buffer tensors
                convert_sync_batchnorm(net)
        self.frozen = freeze_prefixes(net, run.freeze) if run.freeze is not None else []
        self.frozen_params, self.frozen_norms = freeze(net, self.frozen)
        self.loss_fn = m.build_loss().to(self.device)
        # a separate instance for the validation loss: the training step's may be captured in a graph
        self.val_loss_fn = m.build_loss().to(self.device) if run.val else None
        self.item_names = tuple(self.loss_fn.item_names)  # the loss contract: see Model.build_loss
        self.train_loader, self.val_loader = self._loaders(data)
        if self.worker_cap_note:
            log.log(logging.INFO if run.workers is not None else logging.DEBUG, "libreyolo: %s", self.worker_cap_note)
        self.device_augment = self.task.device_augment(self.train_set, cfg.task)   # gpu_augment: per batch
        self.nb = len(self.train_loader)
        self.accumulate = max(round(opt_cfg.nbs / run.batch), 1)
        if opt_cfg.lr0 is None:
            opt_cfg.lr0 = 0.001 if opt_cfg.optimizer.lower() == "adamw" else 0.01
        wd = opt_cfg.weight_decay * run.batch * self.accumulate / opt_cfg.nbs
        # A whole training step (optimizer included) can be captured only with a fused SGD or
        # AdamW whose lr is a device tensor (updated in place by the schedule). float16's
        # GradScaler is graph-safe with a fused optimizer: unscale and the inf check are device
        # kernels, the fused step skips itself on found_inf, and update() rescales in place.
        name = opt_cfg.optimizer.lower()
        if name not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be SGD or AdamW, got {opt_cfg.optimizer!r}")
        self.whole_step = (bool(cfg.graph.cuda_graph) and m.SUPPORTS_CUDA_GRAPH_TRAIN and name in m.WHOLE_STEP_OPTIMIZERS
                           and self.device.type == "cuda")
        groups = param_groups(net, wd)
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
        self.ema = ModelEMA(net, frozen=self.frozen) if opt_cfg.ema else None

        self.start_epoch, self.best_fitness = 0, -1.0
        if run.resume:
            last = self._resume_path()
            ck = load_checkpoint(last)
            st = ck.get("train_state")
            if not st:
                raise ValueError(f"{last} has no training state to resume from")
            if list(st.get("freeze") or []) != list(self.frozen):
                raise ValueError(f"{last} was trained with freeze={st.get('freeze') or None}, this run has "
                                 f"freeze={self.frozen or None}: resume with the run's own freeze")
            net.load_state_dict(st["model_raw"])
            opt.load_state_dict(st["optimizer"])
            match_state_layouts(opt)
            if self.whole_step:  # a loaded tensor lr comes back on the CPU
                for g in opt.param_groups:
                    g["lr"] = torch.tensor(float(g["lr"]), device=self.device)
            self.scaler.load_state_dict(st["scaler"])
            if self.ema is not None and st.get("ema_updates") is not None:
                self.ema.ema.load_state_dict(ck["model"])
                self.ema.updates = int(st["ema_updates"])
            self.start_epoch, self.best_fitness = int(st["epoch"]) + 1, float(st["best_fitness"])
            self.resumed_best_epoch = st.get("best_epoch")
            self.run_dir = last.parent.parent
            log.info("libreyolo: resuming %s from epoch %d", self.run_dir, self.start_epoch + 1)
        if self.dist is not None:   # the others learn the run folder's name
            self.run_dir = Path(self.dist.broadcast_object(str(self.run_dir)))
        self.csv_path = self.run_dir / "results.csv"
        self._setup_runner()

    def _resume_path(self) -> Path:
        run = self.cfg.run
        return (Path(run.resume) if isinstance(run.resume, (str, Path)) and run.resume is not True
                else Path(run.project) / run.name / "weights" / "last.pt")

    def _claim_run_dir(self) -> None:
        """The run folder (``resume``: the checkpoint's; ``exist_ok=False``: the first free
        ``name``, ``name2``, ... claimed by creating it, so that runs started together get folders
        of their own), locked for the run (:class:`RunLock`): a second run into a folder in use
        stops here with a :class:`RunFolderBusy` naming it and the process that holds it."""
        run = self.cfg.run
        self._run_lock, self._made_run_dir, made = None, False, True
        if run.resume:
            run_dir = self._resume_path().parent.parent
            if not run_dir.is_dir():
                return   # the checkpoint's load says what is missing
            made = False
        elif run.exist_ok:
            run_dir = next_run_dir(run.project, run.name, True)
            made = not run_dir.exists()
            run_dir.mkdir(parents=True, exist_ok=True)
        else:
            while True:
                run_dir = next_run_dir(run.project, run.name, False)
                try:
                    run_dir.mkdir(parents=True)
                    break
                except FileExistsError:   # another run took it since: the next name
                    continue
        self._run_lock = RunLock.acquire(run_dir)   # RunFolderBusy: the folder is left as it is
        self.run_dir, self._made_run_dir = run_dir, made
        (run_dir / "weights").mkdir(exist_ok=True)

    def _release_run_dir(self, failed_setup: bool = False) -> None:
        """The run folder's lock released (its file removed); after a set-up that failed, a folder
        this run created and left empty is removed as well."""
        lock, self._run_lock = getattr(self, "_run_lock", None), None
        if lock is not None:
            lock.release()
        run_dir = getattr(self, "run_dir", None)
        if failed_setup and getattr(self, "_made_run_dir", False) and run_dir is not None:
            for folder in (run_dir / "weights", run_dir):
                try:
                    folder.rmdir()   # only if empty
                except OSError:
                    break

    def _setup_runner(self) -> None:
        """The step (forward, loss, backward), the update, and how they run: graphed or eager."""
        cfg, m, net = self.cfg, self.model, self.net
        amp_dtype, loss_fn, prep = self.amp_dtype, self.loss_fn, m.preprocess
        scaler, opt, ema = self.scaler, self.opt, self.ema
        params = [p for p in net.parameters() if p.requires_grad]
        # distributed: the loss computes its share (or local mean) by its DDP_REDUCTION rule, the
        # logged items and - on the update - the flat gradient buffer are all-reduced by it
        d = self.dist
        rule = reduction_of(loss_fn) if d is not None else None
        reduce_grads = GradientReducer(params, d.world, mean=rule == "mean") if d is not None else None
        self.grad_reducer = reduce_grads

        def step(x, *targets):
            # no autocast weight cache: a captured graph must not record casts the cache frees later
            with torch.autocast(self.device.type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None,
                                cache_enabled=False), loss_share(d is not None):
                outputs = m.train_forward(net, prep.normalize(x), *targets)
                loss, items = loss_fn(outputs, *targets)
            backward_into_grads(scaler.scale(loss), params)   # = .backward(), one foreach add
            items = items.detach()
            if d is not None:
                items = d.reduce_items(items, rule)
            return loss.detach(), items

        def optimizer_step() -> None:
            if reduce_grads is not None:   # before unscaling and clipping: every rank clips the same gradient
                reduce_grads()
            if scaler.is_enabled():
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, max_norm=cfg.optim.clip_grad, foreach=True)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=False)
            if ema is not None:
                ema.update(net)

        def mutable_state() -> list[torch.Tensor]:
            return training_state(params, opt, net.buffers(), ema.tensors() if ema is not None else (),
                                  scaler_tensors(scaler))

        if self.whole_step:
            prime_optimizer_state(opt)  # buffers a captured update writes must exist before capture
            if scaler.is_enabled():     # its scale and growth tracker are made at the first scale()
                scaler.scale(torch.zeros((), device=self.device))
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
                                           update=optimizer_step, state=mutable_state,
                                           agree=d.agree if d is not None else None)

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
            set_lr(g, float(np.interp(ni, xi, [start, g["initial_lr"] * self.lr_factor(epoch)])))
            if "momentum" in g:
                g["momentum"] = float(np.interp(ni, xi, [o.warmup_momentum, o.momentum]))

    # ------------------------------------------------------------------ loop
    def step(self, ni: int, batch) -> torch.Tensor:
        """One batch: forward, loss, backward and - once ``accumulate`` batches are in - the
        update, graphed where the runner can. Returns the loss items as float32 on the step's
        device, not waited for: reading them on the host is the caller's sync (train_epoch reads
        them one step late, through :class:`LossFold`)."""
        imgs, *targets = self.device_batch(batch)
        x = imgs.float().div_(255).contiguous(memory_format=self.memory_format)
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
        return items.detach().float()

    def device_batch(self, batch) -> list[torch.Tensor]:
        """The step's batch: :meth:`batch_to_device`, and in a distributed run the targets padded
        to the largest row count of the ranks (a task whose target rows vary: detection). A rank
        meeting a new count would capture - its warm-up running collectives its peers, replaying,
        do not - while the others replay; with one count for all they capture together."""
        imgs, *targets = self.batch_to_device(batch)
        rows = self.task.target_rows(targets) if self.dist is not None else None
        if rows is not None:
            agreed = self.dist.max_int(rows)
            if agreed != rows:
                targets = self.task.pad_target_rows(targets, agreed)
        return [imgs, *targets]

    def batch_to_device(self, batch) -> list[torch.Tensor]:
        """A loader batch on the device; with the task's device augmentation (``gpu_augment``)
        augmented there, before the step and outside its captured graph."""
        batch = [t.to(self.device, non_blocking=True) for t in batch]
        if self.device_augment is not None:
            batch = list(self.device_augment(*batch))
        return batch

    #: start the next epoch's loader (its workers on its first batches) before this epoch's
    #: validation and checkpoints; False: when the next epoch begins (tests and
    #: benchmarks/train_epochs.py compare the two)
    prefetch_next_epoch: bool = True
    #: steps the loop reads a step's loss behind: 1, the device runs step i while the host reads
    #: step i-1's; 0, each step waited for at once (a synchronous loop: the same numbers, for comparison)
    loss_lag: int = 1
    #: the interpreter's thread switch interval (sys.setswitchinterval, seconds) for the run, then
    #: restored; None keeps Python's 5 ms. The checkpoint writer and the plotter hold the GIL while
    #: they pickle and draw, and a main thread that released it (to wait on the device, to launch
    #: a replay) gets it back only at the next switch: a shorter interval bounds that wait
    #: (benchmarks/train_epochs.py's +switch arm measures it)
    switch_interval: float | None = None
    #: the epoch's end joins the previous epoch's checkpoint write before validating (True), or
    #: only before the next write, so that the write overlaps validation (False; the +overlap arm).
    #: None: False when a child process writes (it takes no GIL from validation), else True
    join_write_before_validation: bool | None = None
    #: the objects alive when the epochs start are left out of the garbage collector's full
    #: collections for the run (engine.background.frozen_heap); False: Python's default
    freeze_heap: bool = True
    #: checkpoints written by a child interpreter (engine.ckptwriter: the pickling off this
    #: process's GIL, which the step loop needs); None: on CUDA runs, where a GIL-starved loop
    #: leaves the device idle. False: the writer thread writes them itself
    checkpoint_process: bool | None = None
    #: helper processes the validations' evaluation may use (Task.evaluation_pool: detection
    #: deals its classes out to them, the same figures); below 2: each evaluation in this process.
    #: A quarter of the cores, at most 4 (none on a machine of fewer than 8: a pool needs two)
    eval_processes: int = min(4, (os.cpu_count() or 1) // 4)

    def _prepare_epoch(self, epoch: int) -> None:
        """What epoch ``epoch``'s batches depend on, then its loader iterator: the task's data phase
        (``Task.on_epoch``: close_mosaic writes the shared memory the workers read), the shuffle
        generator re-seeded (seed + epoch), the workers' seed epoch (EpochSeeded), the distributed
        sampler's epoch. With persistent workers ``iter()`` sets them to work on the epoch's first
        batches at once (prefetch_factor per worker), so when this runs before the previous epoch's
        validation those batches load while it validates. The main process's RNGs are seeded in
        :meth:`train_epoch`, after validation, where the step (and a worker-less loader) draws them."""
        cfg = self.cfg
        why = self.task.on_epoch(self.train_set, epoch, cfg.run.epochs, cfg.task)
        self.loader_gen.manual_seed(cfg.run.seed + epoch)
        if self.train_loader.persistent_workers and self._loader_started:
            # a loader draws its workers' base seed from the generator before the shuffle, and a
            # persistent one only when it starts: the same draw here keeps every epoch's order the
            # one a freshly started loader gives (so a resumed run shuffles as an uninterrupted one)
            torch.empty((), dtype=torch.int64).random_(generator=self.loader_gen)
        self._loader_started = True
        self.epoch_seeded.set_epoch(epoch)
        if self.train_sampler is not None:
            self.train_sampler.set_epoch(epoch)
        self._prepared = (epoch, iter(self.train_loader), why)
        self._worker_signal.install()   # torch's SIGCHLD handler is set by then (an iterator with workers)

    #: start the validation loader's workers on its first batches before the epoch's last step,
    #: so validation does not begin by waiting for them (its batches do not depend on the epoch)
    prefetch_validation: bool = True

    def _prefetch_validation(self) -> None:
        """``iter()`` of the validation loader now, for :meth:`validate` to consume: with persistent
        workers that sets them to work at once (prefetch_factor batches each). Only where this
        epoch's validation runs (rank 0, ``val`` on, a non-empty split) and the loader has workers."""
        self._val_batches = None
        loader = getattr(self, "val_loader", None)
        main = self.dist is None or self.dist.is_main
        if (self.prefetch_validation and main and loader is not None and loader.num_workers > 0
                and self.cfg.run.val and len(self.val_set) > 0):
            self._val_batches = (loader, iter(loader))

    def _prepared_for(self, epoch: int) -> tuple:
        prepared = getattr(self, "_prepared", None)
        if prepared is None or prepared[0] != epoch:
            self._prepare_epoch(epoch)
        return self._prepared

    def train_epoch(self, epoch: int) -> torch.Tensor:
        """One epoch over the training set; returns the mean loss items.

        The loop does not wait for the device: each step's items are read one step late
        (:class:`LossFold`), and the progress bar shows those and refreshes at tqdm's own rate."""
        cfg, nb = self.cfg, self.nb
        _, batches, _ = self._prepared_for(epoch)
        self._prepared = None
        seed = cfg.run.seed + epoch
        rank = self.dist.rank if self.dist is not None else 0
        if rank:   # other ranks augment from their own streams
            seed = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        if self.device_augment is not None:
            self.device_augment.seed(cfg.run.seed, epoch, rank)
        self.net.train()
        for module in self.frozen_norms:   # frozen layers keep their normalization statistics
            module.eval()
        fold = LossFold(len(self.item_names), self.device, epoch)
        progress = None
        if cfg.run.verbose:
            from tqdm import tqdm
            progress = tqdm(total=nb, desc=f"epoch {epoch + 1}/{cfg.run.epochs}", unit="batch", leave=True)

        def postfix() -> None:   # the last folded batch's fields; drawn at tqdm's next refresh
            post = {n: f"{v:.3f}" for n, v in zip(self.item_names, fold.mloss.tolist())}
            post.update(fold.counts)
            progress.set_postfix(post, refresh=False)

        wait, t_ready = 0.0, time.perf_counter()
        for i, batch in enumerate(batches):
            wait += time.perf_counter() - t_ready   # the loop waited this long for the loader
            if i == nb - 1:
                self._prefetch_validation()
            ni = i + nb * epoch
            self.warmup(ni, epoch)
            start = fold.start()
            items = self.step(ni, batch)
            counts = {}
            if progress is not None:
                x, targets = self.last_batch
                counts = {**self.task_postfix(targets), "size": x.shape[-1]}
            fold.push(i, start, items, counts)
            if len(fold.pending) > self.loss_lag:   # the previous batch's: finished or finishing
                fold.fold()
                if progress is not None:
                    postfix()
            if progress is not None:
                progress.update(1)
            t_ready = time.perf_counter()
        fold.drain()
        self.loader_wait_s, self.sync_wait_s, self.step_device_s = wait, fold.sync_s, fold.device_s
        self.nonfinite_note = (f"{fold.first_nonfinite} ({fold.nonfinite} of {nb} batches)"
                               if fold.nonfinite else None)
        if progress is not None:
            postfix()
            progress.close()
        if self.last_opt_step < nb * (epoch + 1) - 1:
            # flush gradients still accumulating, so an epoch is self-contained and a
            # resumed run continues exactly where the interrupted one stopped
            self.optimizer_step()
            self.last_opt_step = nb * (epoch + 1) - 1
        for g in self.opt.param_groups:
            set_lr(g, g["initial_lr"] * self.lr_factor(epoch + 1))
        return fold.mloss

    @staticmethod
    def task_postfix(targets) -> dict:
        """Progress-bar fields of the batch's (device) targets (detection: instances), as tensors
        the loop reads one step late (no sync)."""
        if len(targets) == 2 and targets[1].dtype == torch.bool:
            return {"inst": targets[1].sum()}
        return {}

    def _phase(self, epoch: int) -> None:
        """Before an epoch: phase changes that alter what the step computes release its graphs.
        The task's data phase ran already where the epoch's loader was prepared (before the
        previous epoch's validation: :meth:`_prepare_epoch`); its log line is here, at the
        epoch's start. It keeps the step's graphs: a captured step starts at the batch in its
        input buffers (the data pipeline, CPU or device augmentation, is never in the graph), and
        batches of another shape (fewer target rows without mosaic) get graphs of their own."""
        _, _, why = self._prepared_for(epoch)
        if why:
            log.info("libreyolo: %s", why)
        on_epoch = getattr(self.loss_fn, "on_epoch", None)
        if on_epoch is not None and on_epoch(epoch, self.cfg.run.epochs):
            # the loss computes something else from now on: graphs of the old loss are stale
            self.step_runner.release(f"{type(self.loss_fn).__name__} changed at epoch {epoch + 1}")
        if self.val_loss_fn is not None and hasattr(self.val_loss_fn, "on_epoch"):
            self.val_loss_fn.on_epoch(epoch, self.cfg.run.epochs)   # the validation loss follows it

    def _unfreeze(self) -> None:
        """``freeze`` holds for one run: a later ``train()`` of the model sees every layer trainable."""
        for p in self.frozen_params:
            p.requires_grad_(True)
        self.frozen_params = []

    def train(self) -> dict:
        """Set up, train the epochs, end the run (see the module docstring); the run folder is
        locked meanwhile (:class:`RunLock`).

        Ctrl-C (KeyboardInterrupt) stops the run cleanly: the checkpoint write in flight is
        finished (saves are atomic), no more plots are drawn, the loader workers and helper
        processes end, one line says what ``last.pt`` holds and how to continue, and a
        :class:`TrainingInterrupted` (a KeyboardInterrupt: a library does not swallow it) is
        raised with that line, without torch's frames."""
        self.interrupted_in = None   # the epoch Ctrl-C stopped (None: set-up, or not interrupted)
        self._epoch_now = None
        try:
            return self._train()
        except KeyboardInterrupt as exc:
            if isinstance(exc, TrainingInterrupted):
                raise
            message = self._interrupted_message()
            log.warning("libreyolo: %s", message)
        finally:
            self._release_run_dir()
        raise TrainingInterrupted(message)   # outside the handler: no "during handling" context

    def _interrupted_message(self) -> str:
        """What a run stopped by Ctrl-C has on disk: the epoch ``last.pt`` holds (its write in
        flight was joined by the run's end) and the option that continues it."""
        epoch, run_dir = self.interrupted_in, getattr(self, "run_dir", None)
        if epoch is None:   # after the epochs, in the run's last steps
            epoch = getattr(self, "_epoch_now", None)
        if epoch is None or run_dir is None:
            return "training interrupted during set-up; nothing was saved"
        total = self.cfg.run.epochs
        last = run_dir / "weights" / "last.pt"
        saved = getattr(self, "saved_epoch", None)
        if saved is None and self.start_epoch > 0:
            saved = self.start_epoch   # resumed, nothing saved yet in this run: the file resumed from
        where = f"training interrupted in epoch {epoch + 1}/{total}"
        if saved is None:
            return f"{where}; no epoch had been completed, nothing was saved"
        return (f"{where}: {last} holds epoch {saved}/{total}; continue with the same options and "
                f"resume={last}")

    def _train(self) -> dict:
        t_setup = time.perf_counter()
        try:
            self._setup()
        except BaseException:
            self._unfreeze()
            self._release_run_dir(failed_setup=True)
            if self.dist is not None:
                self.dist.teardown()
            raise
        cfg = self.cfg
        self.nw = max(round(cfg.optim.warmup_epochs * self.nb), 1) if cfg.optim.warmup_epochs > 0 else 0
        self.last_opt_step = self.nb * self.start_epoch - 1
        self.history: list[dict] = []
        self.stop_reason: str | None = None
        self.opt.zero_grad(set_to_none=False)
        t_start = time.time()
        # where the run's wall goes (see timing_line): set-up, the epochs' steps, validation,
        # the rest of each epoch's end (checkpoint snapshot, CSV, the next epoch's loader), the end
        timing = self.timing = {"setup_s": time.perf_counter() - t_setup, "train_s": 0.0, "val_s": 0.0,
                                "eval_s": 0.0, "ckpt_wait_s": 0.0, "between_s": 0.0, "end_s": 0.0}
        # between_s and end_s by part: the next epoch's loader ("prepare"), each hook (less the
        # validation and the checkpoint waits counted apart), the loaders' shutdown ("loaders")
        parts, ends = collections.defaultdict(float), collections.defaultdict(float)
        timing["between_parts"], timing["end_parts"] = parts, ends
        # validation's time by part (see validate): the loader, the host part, the device's stage and loss
        val_parts = timing["val_parts"] = collections.defaultdict(float)

        def waits(state: dict) -> float:   # an epoch end's time counted apart from between_s
            return state.get("val_s", 0.0) + state.get("ckpt_wait_s", 0.0)
        d = self.dist
        main = d is None or d.is_main
        # rank 0 alone validates, logs and writes; the others keep the evaluation fields only
        hooks = self.hooks if main else []
        for hook in self.hooks if main else [h for h in self.hooks if isinstance(h, EvaluationHook)]:
            hook.on_train_start(self)
        interval = sys.getswitchinterval()
        # a DataLoader worker's death arrives as an exception raised wherever the main thread is
        # (torch's SIGCHLD handler), also between a grad-mode switch and its restore (an
        # optimizer step, a no_grad block's exit): the run's end puts the caller's mode back
        grad_enabled = torch.is_grad_enabled()
        heap = contextlib.ExitStack()
        try:
            heap.enter_context(frozen_heap(self.freeze_heap))
            if self.switch_interval is not None:
                sys.setswitchinterval(self.switch_interval)
            for epoch in range(self.start_epoch, cfg.run.epochs):
                self._epoch_now = epoch
                died = lost = diverged = None
                try:
                    t_epoch = time.time()
                    self._phase(epoch)
                    mloss = self.train_epoch(epoch)
                    state = {"epoch": epoch, "mloss": mloss, "time_s": time.time() - t_epoch}
                    # the epoch's mean loss, on the host already: non-finite if any step's was
                    # (EvaluationHook adds the validation loss); such an epoch is never the best
                    state["finite"] = bool(torch.isfinite(mloss).all())
                    if not state["finite"]:
                        state["nonfinite"] = self.nonfinite_note
                    t_end = time.perf_counter()
                    if self.prefetch_next_epoch and epoch + 1 < cfg.run.epochs:
                        self._prepare_epoch(epoch + 1)   # its first batches load while this one validates
                    parts["prepare"] += time.perf_counter() - t_end
                    for hook in hooks:   # each hook's time less the validation and waits it added
                        t_hook, counted = time.perf_counter(), waits(state)
                        hook.on_epoch_end(self, state)
                        parts[type(hook).__name__] += time.perf_counter() - t_hook - (waits(state) - counted)
                    timing["train_s"] += state["time_s"]
                    for k in ("val_s", "eval_s", "ckpt_wait_s"):
                        timing[k] += state.get(k, 0.0)
                    for k, v in state.get("val_parts", {}).items():
                        val_parts[k] += v
                    timing["between_s"] = sum(parts.values())
                    diverged = self._check_finite(epoch, state) if main else None
                    if d is not None:   # the others wait here for rank 0's epoch end, and its decision
                        self.stop_reason, diverged = d.broadcast_object((self.stop_reason, diverged))
                    if self.stop_reason and diverged is None:
                        log.info("libreyolo: %s", self.stop_reason)
                        break
                except RuntimeError as exc:
                    if d is not None and d.failure(exc):
                        lost = f"{type(exc).__name__}: {str(exc).strip()}"
                    elif not worker_died(exc):
                        raise
                    else:
                        died = str(exc).strip()
                if lost is not None:
                    raise TrainingError(self._rank_failure_message(epoch, lost))
                if diverged is not None:
                    raise TrainingDiverged(diverged)
                if died is not None:
                    # raised outside the handler, with the loaders dropped: torch's error, its
                    # traceback and the (persistent) iterators holding the dead worker's
                    # registration go, so torch's SIGCHLD check does not fire again later
                    self._worker_signal.quiet = True   # (if the loader's own check saw it first)
                    self._drop_loaders()
                    raise TrainingError(self._worker_death_message(epoch, died))
            if d is not None:   # every rank returns rank 0's account of the run
                (self.history, self.best_metrics, self.best_epoch, self.best_fitness) = d.broadcast_object(
                    (self.history, self.best_metrics, self.best_epoch, self.best_fitness))
        except KeyboardInterrupt:   # Ctrl-C, wherever in the epochs: the hooks' ends below see it
            self.interrupted_in = getattr(self, "_epoch_now", self.start_epoch)
            self._worker_signal.quiet = True   # the workers' exits as the run stops
            raise
        finally:
            sys.setswitchinterval(interval)
            torch.set_grad_enabled(grad_enabled)
            t_close = time.perf_counter()
            try:
                for hook in hooks:
                    t_hook = time.perf_counter()
                    hook.on_train_end(self)
                    ends[type(hook).__name__] += time.perf_counter() - t_hook
            finally:   # also when a hook's end raises (a checkpoint's background write failed)
                heap.close()   # the objects frozen at the start are collectable again
                self._unfreeze()
                child = getattr(self, "checkpoint_writer_process", None)
                if child is not None:   # CheckpointHook's end closed it, unless a hook before it raised
                    child.close()       # (after the write in flight: close waits for its lock)
                t_loaders = time.perf_counter()
                self._worker_signal.quiet = True   # the workers' exits as they are shut down
                self._close_loaders()
                self._worker_signal.uninstall()
                ends["loaders"] += time.perf_counter() - t_loaders
                if d is not None:
                    if self.cfg.run.sync_bn:
                        revert_sync_batchnorm(self.net)
                    d.teardown()
                timing["end_s"] = time.perf_counter() - t_close
        if self.seam is not None:
            self.model.set_train_seam(self.net, None)
        # the trained weights the Model keeps are the EMA's
        if self.ema is not None:
            self.net.load_state_dict(self.ema.ema.state_dict())
        if self.channels_last:   # predict's layout is the contiguous one (its graphs and numbers)
            self.net.to(memory_format=torch.contiguous_format)
        self.net.eval()
        self.model.trained = True
        final = self.history[-1] if self.history else {}
        item_names = self.item_names
        runner, seam = self.step_runner, self.seam
        best = self.best_metrics or {}
        return {"run_dir": str(self.run_dir), "epochs": len(self.history), "time_s": time.time() - t_start,
                "timing": {k: dict(v) if isinstance(v, dict) else v for k, v in timing.items()},
                **{k: final.get(k) for k in self.metric_keys}, "best_metrics": best,
                "best_epoch": self.best_epoch, "best_fitness": self.best_fitness, "history": self.history,
                "stop_reason": self.stop_reason,
                "loss_names": list(item_names),
                "losses": [[h[f"train/{n}_loss"] for n in item_names] for h in self.history],
                "cuda_graph": runner.info() if seam is None else {**runner.info(), "seam": seam.info()},
                "best": str(self.run_dir / "weights" / "best.pt"), "last": str(self.run_dir / "weights" / "last.pt")}

    def _close_loaders(self) -> None:
        """Stop the loaders' persistent worker processes (and pin-memory threads) now, when the run
        ends, instead of leaving them to the interpreter's exit."""
        import gc
        # a prefetched epoch's iterator, and validation's, too
        self.train_loader = self.val_loader = self._prepared = self._val_batches = None
        gc.collect()

    def _drop_loaders(self) -> None:
        """Shut the loaders' worker processes down after one of them died. torch's SIGCHLD check
        reports the dead worker again while the others are joined (inside the iterators'
        ``__del__``, where Python can only print it as an "Exception ignored" traceback); the
        run is already stopping with its own message, so those repeats are not printed."""
        import gc
        import sys
        previous = sys.unraisablehook

        def hook(unraisable):
            if not worker_died(unraisable.exc_value):
                previous(unraisable)

        sys.unraisablehook = hook
        try:
            self.train_loader = self.val_loader = self._prepared = self._val_batches = None
            gc.collect()
        finally:
            sys.unraisablehook = previous

    def _last_pt_kept(self) -> str:
        """What ``last.pt`` holds, for a run stopping on an error: the background write in flight
        is finished first (its own error logged), so the sentence says what is on disk."""
        writer = getattr(self, "checkpoint_writer", None)
        error = writer.close(raising=False) if writer is not None else None
        if error is not None:
            log.error("libreyolo: writing a checkpoint failed as well: %s", error)
        last = self.run_dir / "weights" / "last.pt"
        saved = getattr(self, "saved_epoch", None)
        if saved is None and self.start_epoch > 0:
            saved = self.start_epoch   # resumed, nothing saved yet in this run: the file resumed from
        return (f"{last} holds epoch {saved} and is intact: continue with resume=True" if saved is not None
                else "nothing had been saved yet in this run")

    def _check_finite(self, epoch: int, state: dict) -> str | None:
        """After epoch ``epoch``'s end: None, or the message of a diverged run. An epoch whose
        mean training loss (read from the steps one step late: no added sync) or validation loss
        is not finite is counted; the first one is a warning, ``nan_patience`` of them in a row -
        or one as the run's last epoch, whose weights the run would hand back - stop the run."""
        if state.get("finite", True):
            self._nonfinite_run = 0
            return None
        self._nonfinite_run = n = getattr(self, "_nonfinite_run", 0) + 1
        cfg, what = self.cfg, state.get("nonfinite") or f"non-finite loss at epoch {epoch + 1}"
        if n == 1:
            self._nonfinite_first = what   # the streak's first, named in the error
        what = getattr(self, "_nonfinite_first", what)
        patience = cfg.run.nan_patience
        if n < patience and epoch + 1 < cfg.run.epochs and not self.stop_reason:
            if not getattr(self, "_nan_warned", False):
                self._nan_warned = True
                log.warning("libreyolo: %s; training goes on, and stops if the loss is not finite for %d epochs "
                            "in a row (nan_patience=%d); an epoch with a non-finite loss is never best.pt",
                            what, patience, patience)
            return None
        o = cfg.optim
        span = f"epoch {epoch + 1}" if n == 1 else f"epochs {epoch + 2 - n}-{epoch + 1}"
        hints = [f"lower lr0 (this run: {o.lr0:g})", f"clip the gradients harder with a lower clip_grad (this run: "
                 f"{o.clip_grad:g})", f"lengthen warmup_epochs (this run: {o.warmup_epochs:g})"]
        if self.amp_dtype == torch.float16:
            hints.append("use amp=bf16 or amp=false (float16 may overflow)")
        best = (f"best.pt holds epoch {self.best_epoch}, the best with finite losses"
                if getattr(self, "best_epoch", None) is not None
                else "no epoch of this run had finite losses, so it wrote no best.pt")
        return (f"training diverged: the loss was not finite in {span} of {cfg.run.epochs} ({what}; "
                f"nan_patience={patience}). To fix it: {'; '.join(hints)}; or check the labels. {best}; last.pt "
                f"holds the diverged weights of epoch {epoch + 1}")

    def _rank_failure_message(self, epoch: int, reason: str) -> str:
        """What to tell the user when a collective failed during ``epoch`` (another rank stopped,
        or the process group timed out)."""
        return (f"distributed training stopped in epoch {epoch + 1}/{self.cfg.run.epochs} on rank {self.dist.rank} "
                f"of {self.dist.world}: a collective failed ({reason}). Another rank stopped (see its error "
                f"and torchrun's summary) or did not answer within ddp_timeout={self.cfg.run.ddp_timeout:g} s. "
                f"{self._last_pt_kept()}.")

    def _worker_death_message(self, epoch: int, reason: str) -> str:
        """What to tell the user when a DataLoader worker process died during ``epoch``."""
        return (f"training stopped in epoch {epoch + 1}/{self.cfg.run.epochs}: a DataLoader worker process "
                f"died ({reason}). The usual cause is the out-of-memory killer: lower workers= "
                f"or batch=, or see the system log. {self._last_pt_kept()}.")

    @property
    def eval_net(self) -> nn.Module:
        return self.ema.ema if self.ema is not None else self.net

    def checkpoint(self, epoch: int, with_state: bool, host: bool = True) -> dict:
        """The LibreYOLO checkpoint of the EMA weights; ``with_state`` adds what ``resume`` needs
        (raw weights, optimizer, scaler, EMA count, epoch): ``last.pt`` only. The weights are
        host copies; with ``host=False`` they, like the optimizer's state always, are the
        device's tensors, for :class:`~libreyolo.weights.PackedSnapshot` to copy all at once."""
        from ..models.base import _weights
        ck = self.model.checkpoint_of(self.eval_net, host)
        ck["train_metrics"] = self.epoch_metrics
        if with_state:
            ck["train_state"] = {
                "model_raw": _weights(self.net, host),
                "optimizer": self.opt.state_dict(), "scaler": self.scaler.state_dict(),
                "ema_updates": self.ema.updates if self.ema is not None else None,
                "epoch": epoch, "best_fitness": self.best_fitness, "best_epoch": self.best_epoch,
                "freeze": list(self.frozen),
                "args": {k: v for k, v in self.cfg.as_dict().items() if isinstance(v, (int, float, str, bool))},
            }
        return ck
