"""A training run's set-up: the options checked once (:func:`check_config`), then everything the
loop needs built on the trainer (:func:`set_up`).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ..device import require_torch_pair
from ..distributed import Distributed, convert_sync_batchnorm
from ..threads import apply_threads
from .config import TrainConfig
from .optim import ModelEMA, freeze, freeze_prefixes, match_state_layouts, param_groups
from .runs import RunFolder, resume_path
from .step import build_step

log = logging.getLogger(__name__)


def check_config(cfg: TrainConfig, stride: int) -> None:
    """Validate the options once more before anything is loaded; canonical values in place.

    Each group checked its fields when it was made (``__post_init__``: the CLI's checks and
    messages); they are checked again here (:func:`~libreyolo.options.check_fields`) for values
    set after that. What a field cannot check alone is checked here: the image size rounded up to
    the model's stride (with one warning, as predict does), the rules between options, and the
    task's own check."""
    from ..options import OptionError, check_fields, check_imgsz, parse_loggers
    for group in (cfg.run, cfg.optim, cfg.graph, cfg.tune):
        check_fields(group)
    r = cfg.run
    r.imgsz = check_imgsz(r.imgsz, stride)
    r.loggers = parse_loggers(r.loggers)   # none given: no loggers, ()
    if r.patience and not r.val:
        raise OptionError(f"patience={r.patience} needs validation: early stopping follows the validation "
                          "metric, and val=False turns validation off")
    cfg.task.check()


def device_settings(model, cfg: TrainConfig) -> tuple[torch.device, torch.dtype | None, bool]:
    """Where a run (or a validation) of ``model`` under ``cfg`` computes: the device (a
    distributed rank's own; ``auto``: the model's), the autocast dtype (None: none; CUDA only) and
    whether the network and batches are channels_last."""
    from ..device import select_device
    from ..distributed import launched, local_device, parse_devices
    from ..options import parse_amp
    if launched() or parse_devices(cfg.run.device) is not None:
        device = select_device(local_device(cfg.run.device))   # this rank's device
    else:
        device = select_device(cfg.run.device) if cfg.run.device != "auto" else model.device
    amp_dtype = parse_amp(cfg.graph.amp, model.AMP_DTYPE) if device.type == "cuda" else None
    cl = cfg.graph.channels_last
    return device, amp_dtype, bool(model.CHANNELS_LAST and device.type == "cuda") if cl is None else cl


def set_up(t) -> None:
    """The trainer ``t``'s run made ready: the process group (a distributed run), the run folder
    (rank 0), seeds, data, network (classes, initialization, freeze), loss, loaders, optimizer,
    EMA, resume state, step runner."""
    from ..weights import load_checkpoint
    cfg, m = t.cfg, t.model
    run, opt_cfg = cfg.run, cfg.optim
    t.dist = Distributed.setup(run.device, run.ddp_timeout)
    if t.dist is not None:
        t.device = t.dist.device
        t.dist.local_batch(run.batch)   # a batch that does not divide fails before any work
        if not t.dist.is_main:
            run.verbose = False   # rank 0 alone reports progress
    apply_threads(cfg.tune.threads, t.device)   # the CPU's intra-op threads (libreyolo.threads)
    require_torch_pair()   # a broken torch/torchvision pair fails now, not at the first validation's NMS
    if run.sync_bn:
        if t.dist is None or t.device.type != "cuda":
            from ..options import OptionError
            raise OptionError("sync_bn=True synchronizes BatchNorm across the GPUs of a distributed run "
                              "(device=0,1 or torchrun); torch's SyncBatchNorm runs on CUDA only")
    if t.dist is None or t.dist.is_main:   # rank 0 alone writes the run folder
        t.run_folder = RunFolder.claim(run)   # before any work: a folder in use fails at once
    t.run_dir = t.run_folder.path
    torch.manual_seed(run.seed)
    np.random.seed(run.seed)
    if t.dist is not None:   # rank 0 first: a built-in set is generated once, not per rank
        data = t.dist.main_first(lambda: t.task.resolve_data(run.data), f"prepare data={run.data!r}")
    else:
        data = t.task.resolve_data(run.data)
    if data.nc != m.nc:
        log.info("dataset has %d classes, model %d: rebuilding the head for %d classes",
                 data.nc, m.nc, data.nc)
        m.reset_classes(data.nc, data.names)
    else:
        m.names = dict(data.names)
    t.task.prepare_model(m, data)
    m.imgsz = run.imgsz
    net = t.net = m.model
    if not m.trained and not run.resume:
        m.init_for_training(net)   # the original recipes' prior bias on class/objectness logits
    t.task.prepare_training(m, net, cfg.task)   # the task's training-only settings of the network
    net.to(t.device, memory_format=t.memory_format).train()
    if t.dist is not None:
        t.dist.broadcast_module(net)   # every rank starts from rank 0's weights
        if run.sync_bn:   # in place: the same parameter and buffer tensors
            convert_sync_batchnorm(net)
    t.frozen = freeze_prefixes(net, run.freeze) if run.freeze is not None else []
    t.frozen_params, t.frozen_norms = freeze(net, t.frozen)
    t.loss_fn = m.build_loss().to(t.device)
    # a separate instance for the validation loss: the training step's may be captured in a graph
    t.val_loss_fn = m.build_loss().to(t.device) if run.val else None
    t.item_names = tuple(t.loss_fn.item_names)  # the loss contract: see Model.build_loss
    t.train_loader, t.val_loader = t.make_loaders(data)
    if t.worker_cap_note:
        log.log(logging.INFO if run.workers is not None else logging.DEBUG, "%s", t.worker_cap_note)
    t.device_augment = t.task.device_augment(t.train_set, cfg.task)   # gpu_augment: per batch
    t.nb = len(t.train_loader)
    t.accumulate = max(round(opt_cfg.nbs / run.batch), 1)
    if opt_cfg.lr0 is None:
        opt_cfg.lr0 = 0.001 if opt_cfg.optimizer.lower() == "adamw" else 0.01
    wd = opt_cfg.weight_decay * run.batch * t.accumulate / opt_cfg.nbs
    # A whole training step (optimizer included) can be captured only with a fused SGD or
    # AdamW whose lr is a device tensor (updated in place by the schedule). float16's
    # GradScaler is graph-safe with a fused optimizer: unscale and the inf check are device
    # kernels, the fused step skips itself on found_inf, and update() rescales in place.
    name = opt_cfg.optimizer.lower()
    if name not in ("sgd", "adamw"):
        raise ValueError(f"optimizer must be SGD or AdamW, got {opt_cfg.optimizer!r}")
    t.whole_step = (bool(cfg.graph.cuda_graph) and m.SUPPORTS_CUDA_GRAPH_TRAIN and name in m.WHOLE_STEP_OPTIMIZERS
                       and t.device.type == "cuda")
    groups = param_groups(net, wd)
    if t.whole_step:
        for g in groups:
            g["lr"] = torch.tensor(opt_cfg.lr0, device=t.device)
    fused = True if t.whole_step else None
    if name == "adamw":
        # capturable: AdamW refuses to be captured without it (it keeps its step on the device)
        opt = torch.optim.AdamW(groups, lr=opt_cfg.lr0, betas=(opt_cfg.momentum, 0.999), fused=fused,
                                capturable=bool(t.whole_step))
    else:
        opt = torch.optim.SGD(groups, lr=opt_cfg.lr0, momentum=opt_cfg.momentum, nesterov=True, fused=fused)
    for g in opt.param_groups:
        g["initial_lr"] = opt_cfg.lr0
    t.opt = opt
    t.scaler = torch.amp.GradScaler("cuda", enabled=t.amp_dtype == torch.float16)
    t.ema = ModelEMA(net, frozen=t.frozen) if opt_cfg.ema else None

    t.start_epoch, t.best_fitness = 0, -1.0
    if run.resume:
        last = resume_path(run)
        ck = load_checkpoint(last)
        st = ck.get("train_state")
        if not st:
            raise ValueError(f"{last} has no training state to resume from")
        if list(st.get("freeze") or []) != list(t.frozen):
            raise ValueError(f"{last} was trained with freeze={st.get('freeze') or None}, this run has "
                             f"freeze={t.frozen or None}: resume with the run's own freeze")
        net.load_state_dict(st["model_raw"])
        opt.load_state_dict(st["optimizer"])
        match_state_layouts(opt)
        if t.whole_step:  # a loaded tensor lr comes back on the CPU
            for g in opt.param_groups:
                g["lr"] = torch.tensor(float(g["lr"]), device=t.device)
        t.scaler.load_state_dict(st["scaler"])
        if t.ema is not None and st.get("ema_updates") is not None:
            t.ema.ema.load_state_dict(ck["model"])
            t.ema.updates = int(st["ema_updates"])
        t.start_epoch, t.best_fitness = int(st["epoch"]) + 1, float(st["best_fitness"])
        t.resumed_best_epoch = st.get("best_epoch")
        t.run_dir = last.parent.parent
        log.info("resuming %s from epoch %d", t.run_dir, t.start_epoch + 1)
    if t.dist is not None:   # the others learn the run folder's name
        t.run_dir = Path(t.dist.broadcast_object(str(t.run_dir)))
    t.csv_path = t.run_dir / "results.csv"
    build_step(t)
