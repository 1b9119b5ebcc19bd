"""Validation as a function: :func:`evaluate` runs a network over a loader's batches and returns
the task's metrics with the evaluator that computed them (in the shape of detectron2's
``inference_on_dataset``). Training's evaluation hook calls it every epoch (on the EMA weights,
with the validation loss, through a stage kept for the run); ``Model.val`` calls it once.

Each batch goes through validation's stage (:mod:`libreyolo.engine.valgraph`): the network and
the evaluator's device part on fixed-shape batches (a last partial batch padded), replayed from a
CUDA graph with ``cuda_graph=True`` on a capturable family - the same numbers as eager, bit for
bit - then the evaluator's host part.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """What :func:`evaluate` found: the task's metrics, the evaluator holding this pass's
    predictions (for plots, images, COCO results), the validation loss (with ``loss_fn``: a CPU
    tensor named like the loss's ``item_names``, averaged over the images; else None), where the
    time went (``parts``: waiting for the loader, the evaluator's host part, the device time of the
    stage and of the loss, seconds) and the evaluator's final computation (``eval_s``)."""

    metrics: dict
    evaluator: Any
    loss: torch.Tensor | None = None
    parts: dict[str, float] = field(default_factory=dict)
    eval_s: float = 0.0


def validation_stage(model, net: nn.Module, loader, cuda_graph: bool, device: torch.device, capturer: Any = None,
                     previous=None):
    """The :class:`~libreyolo.engine.valgraph.ValidationStage` for ``net`` on ``loader``'s batches:
    ``previous`` when it is the same network and batch (a run keeps its stage, so its graph is
    captured once), else a new one - graphed when ``cuda_graph`` is on and the family is
    capturable, eager otherwise; the batch fixed at the loader's (or the split's size).
    ``capturer``: how graphs are captured (None: CUDA graphs; tests pass a CPU stand-in)."""
    from .valgraph import ValidationStage, graph_validation
    batch = min(int(loader.batch_size or 1), max(1, len(loader.dataset)))
    if previous is not None and previous.net is net and previous.batch == batch:
        return previous
    graphs, why = graph_validation(model, cuda_graph, device, capturer)
    if graphs:
        log.info("validating %s through a captured stage (batch %d)", model.FAMILY, batch)
    elif cuda_graph:
        log.info("validating %s eager: %s", model.FAMILY, why)
    return ValidationStage(model, net, batch, graphs, capturer)


@torch.no_grad()
def evaluate(model, loader, *, net: nn.Module | None = None, options: Any = None, device: torch.device | None = None,
             amp_dtype: torch.dtype | None = None, memory_format: torch.memory_format = torch.contiguous_format,
             stage=None, pool: Any = None, progress: bool = False, loss_fn: nn.Module | None = None, seed: int = 0,
             batches: Any = None) -> Evaluation:
    """The task's metrics of ``net`` (default: ``model.model``) on ``loader``'s batches, in eval
    mode (its mode restored after), under autocast to ``amp_dtype`` (None: none).

    Args:
        model: the libreyolo Model (its task, preprocessing and family).
        loader: a DataLoader of the task's validation batches (``Task.datasets``).
        net: the network evaluated (training: the EMA weights).
        options: the task's options (thresholds; default: the task's defaults).
        device: where the batches go (default: the model's).
        memory_format: the batches' layout (channels_last where the network is).
        stage: the stage to run the batches through (:func:`validation_stage`; default: an eager one).
        pool: the task's evaluation helper processes (``Task.evaluation_pool``), or None.
        progress: a progress bar.
        loss_fn: training's loss module: also the validation loss (the same loss as training on
            each batch's training-format outputs, ``Model.val_loss_outputs``; its own randomness
            drawn from ``seed``, training's random stream left as it was). The metrics are the
            same with or without it.
        batches: an iterator of ``loader`` already started (its workers prefetching), consumed
            instead of a new one.
    """
    net = model.model if net is None else net
    device = model.device if device is None else device
    options = model.task_def.Options() if options is None else options
    amp = amp_dtype is not None
    was_training = net.training
    net.eval()
    prep = model.preprocess
    if stage is None:
        stage = validation_stage(model, net, loader, False, device)
    evaluator = model.task_def.evaluator(model, options)
    evaluator.pool = pool
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
    cuda = device.type == "cuda"
    # the events go on the device's current stream (not the current device's: see LossFold)
    stream = torch.cuda.current_stream(device) if cuda else None

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
        rng = torch.random.fork_rng(devices=[device] if cuda else [])
    try:
        with rng:
            if loss_fn is not None:
                torch.manual_seed(seed)
            t_wait = time.perf_counter()
            for batch in (batches if batches is not None else loader):
                parts["loader"] += time.perf_counter() - t_wait
                x = batch[0].to(device, non_blocking=True).float().div_(255)
                x = prep.normalize(x.contiguous(memory_format=memory_format))
                m0 = mark()
                with torch.autocast(device.type, dtype=amp_dtype or torch.float16, enabled=amp):
                    out, raw = stage(x, evaluator, with_raw=loss_fn is not None)
                    m1 = mark()
                    if loss_fn is not None:
                        targets = [t.to(device, non_blocking=True) for t in batch[1:]]
                        _, items = loss_fn(model.val_loss_outputs(net, raw, x, *targets), *targets)
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
    loss = None
    if loss_fn is not None:
        loss = (total / max(images, 1)).cpu() if total is not None else None
    if cuda and spans:
        spans[-1][2].synchronize()
    for a, b, c in spans:
        if cuda:
            parts["stage"] += a.elapsed_time(b) / 1e3
            parts["loss"] += b.elapsed_time(c) / 1e3
        else:
            parts["stage"] += b - a
            parts["loss"] += c - b
    t0 = time.perf_counter()
    metrics = evaluator.evaluate()
    return Evaluation(metrics, evaluator, loss, parts, time.perf_counter() - t0)
