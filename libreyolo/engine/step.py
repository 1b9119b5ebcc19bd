"""The training step and the reading of its loss: :func:`build_step` makes the step (forward,
loss, backward, the update; graphed where it can be), :class:`LossFold` folds each step's loss
items into the epoch's mean one step late, so the loop never waits for the step it launched.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ..distributed import GradientReducer, loss_share, reduction_of
from ..graphs.training import (
    GraphedSegment,
    TrainStepRunner,
    backward_into_grads,
    prime_optimizer_state,
    scaler_tensors,
    training_state,
)

log = logging.getLogger(__name__)


class LossFold:
    """An epoch's mean loss items, folded on the host one step late, so that the loop never waits
    for the step it has just launched.

    :meth:`push` takes a step's items (and the progress bar's counts) as device tensors, queues
    their copy into pinned host memory behind the step on its stream and records an event;
    :meth:`fold`, called once the next step is launched, waits for that event - the device is
    then still busy with the next step, and the loader already fetching the one after - and folds
    the values in exactly as a synchronous loop does: ``mloss = (mloss * i + items) / (i + 1)``
    in float32 on the host, so the epoch's mean is the same bit for bit. A non-finite loss is
    counted (``nonfinite``) and the first one named (``first_nonfinite``: epoch, batch, items); it
    makes the epoch's mean non-finite, which the trainer acts on (:meth:`~libreyolo.engine.hooks.StopHook.check_finite`).

    Timing, for the per-epoch accounting: ``sync_s`` is the host time blocked waiting for a step's
    results; ``device_s`` the steps' spans on the device (CUDA events from before the batch's
    upload to after the step; elsewhere, where the step is synchronous, its host time).
    """

    def __init__(self, n_items: int, device: torch.device, epoch: int):
        self.cuda = device.type == "cuda"
        # the events go on the step's stream (its device's current one, which need not be the
        # current device's: a run on cuda:1 in a process whose current device is cuda:0)
        self.stream = torch.cuda.current_stream(device) if self.cuda else None
        self.epoch = epoch
        self.mloss = torch.zeros(n_items)
        self.pending: list[tuple] = []
        self.counts: dict[str, int] = {}   # the last folded batch's progress-bar fields
        self.nonfinite = 0                  # batches whose loss was not finite
        self.first_nonfinite: str | None = None   # the first of them, named (epoch, batch, items)
        self.sync_s = self.device_s = 0.0

    def start(self) -> Any:
        """Before a step's batch is uploaded: the mark its device span starts from."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(self.stream)
            return ev
        return time.perf_counter()

    def push(self, i: int, start: Any, items: torch.Tensor, counts: dict[str, Any]) -> None:
        """Batch ``i``'s items (float32, on the step's device) and progress fields (device
        scalars or ints), not waited for."""
        if self.cuda:
            host = torch.empty(items.shape, dtype=items.dtype, pin_memory=True)
            host.copy_(items, non_blocking=True)
            fields = {}
            for k, v in counts.items():
                if isinstance(v, torch.Tensor):
                    v = torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(v, non_blocking=True)
                fields[k] = v
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
        else:   # the step ran synchronously (another accelerator's values are read now, as before)
            host = items.cpu()
            fields = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in counts.items()}
            end = time.perf_counter()
            self.device_s += end - start
        self.pending.append((i, start, end, host, fields))

    def fold(self) -> None:
        """Fold the oldest pushed batch in (waiting for its step to finish on the device)."""
        i, start, end, items, fields = self.pending.pop(0)
        if self.cuda:
            t0 = time.perf_counter()
            end.synchronize()
            self.sync_s += time.perf_counter() - t0
            self.device_s += start.elapsed_time(end) / 1e3
        if not torch.isfinite(items).all():
            self.nonfinite += 1
            if self.first_nonfinite is None:
                self.first_nonfinite = f"non-finite loss at epoch {self.epoch + 1} batch {i}: {items.tolist()}"
        self.mloss = (self.mloss * i + items) / (i + 1)
        self.counts = {k: int(v) for k, v in fields.items()}

    def drain(self) -> None:
        while self.pending:
            self.fold()


def build_step(t) -> None:
    """The trainer ``t``'s step (forward, loss, backward), its update, and how they run: graphed
    or eager. Sets ``t.grad_reducer``, ``t.seam``, ``t.optimizer_step`` and ``t.step_runner``."""
    cfg, m, net = t.cfg, t.model, t.net
    amp_dtype, loss_fn, prep = t.amp_dtype, t.loss_fn, m.preprocess
    scaler, opt, ema, device = t.scaler, t.opt, t.ema, t.device
    params = [p for p in net.parameters() if p.requires_grad]
    # distributed: the loss computes its share (or local mean) by its DDP_REDUCTION rule, the
    # logged items and - on the update - the flat gradient buffer are all-reduced by it
    d = t.dist
    rule = reduction_of(loss_fn) if d is not None else None
    reduce_grads = GradientReducer(params, d.world, mean=rule == "mean") if d is not None else None
    t.grad_reducer = reduce_grads

    def step(x, *targets):
        # no autocast weight cache: a captured graph must not record casts the cache frees later
        with torch.autocast(device.type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None,
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

    if t.whole_step:
        prime_optimizer_state(opt)  # buffers a captured update writes must exist before capture
        if scaler.is_enabled():     # its scale and growth tracker are made at the first scale()
            scaler.scale(torch.zeros((), device=device))
    # Families whose step cannot be one graph may capture a fixed-shape front part instead
    # (DETR: backbone + encoder forward and backward; decoder, matcher and loss eager).
    t.seam = None
    if (cfg.graph.cuda_graph and device.type == "cuda" and not m.SUPPORTS_CUDA_GRAPH_TRAIN
            and m.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM):
        front = m.train_seam(net)
        if front is not None:
            t.seam = GraphedSegment(front, name=f"{m.FAMILY} backbone+encoder")
            m.set_train_seam(net, t.seam)
            log.info("training %s with its backbone+encoder in CUDA graphs (forward and "
                     "backward); decoder, matching and loss eager", m.FAMILY)
    t.optimizer_step = optimizer_step
    t.step_runner = TrainStepRunner(net, step, enabled=bool(cfg.graph.cuda_graph) and t.seam is None,
                                    family=m.FAMILY, supported=m.SUPPORTS_CUDA_GRAPH_TRAIN,
                                    update=optimizer_step, state=mutable_state,
                                    agree=d.agree if d is not None else None)
