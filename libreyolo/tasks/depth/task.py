"""Monocular depth: a relative (inverse) depth value per pixel.

Predict stage (on the device, captured): ``model.infer`` gives the depth map (B, 1, H', W') at the
network's input size (the preprocessing resized the whole image to it, keeping its aspect ratio -
"cover" - or stretching it to the square); the stage drops the
channel axis and - in the stage that starts from uint8 images, whose size is then fixed and part
of the graph's key - resizes the map back to the images' (h, w) (bilinear, align_corners=True, as
Depth Anything's own inference does), so one graph runs resize -> network -> resize back. The
stage that starts from a preprocessed batch serves images of every size; its maps are resized
after it, on the device, by the same function (identical numbers). The maps of a chunk reach the
host in one copy (through pinned memory: :func:`download`) and become ``Results.depth``
(:class:`~.results.DepthMap`).

Training (optional for this task; the family's recipe in its ``TRAIN_DEFAULTS``): images + depth
maps or the built-in ``shapes-depth`` set (:mod:`.data`, :mod:`.synthetic`), trained in
disparity (inverse depth, what the network predicts) with a scale-and-shift-invariant loss
(:class:`ScaleShiftInvariantLoss`); validation aligns each prediction the same way and reports
AbsRel and delta1 (fitness: delta1).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...options import Float, Fraction, check_fields, option
from ..base import Evaluator, PredictPlan, Task, TaskOptions, host_views
from .results import DepthMap


def resize_depth(depth: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, H, W) float maps -> (B, h, w): bilinear with align_corners=True (the corner pixels
    keep their values), on their device; the maps themselves when the size already matches."""
    if tuple(depth.shape[-2:]) == (h, w):
        return depth
    return F.interpolate(depth[:, None], size=(int(h), int(w)), mode="bilinear", align_corners=True)[:, 0]


#: below this many torch threads a map is copied to the host directly (see :func:`download`)
STAGE_MIN_THREADS = 2


def download(t: torch.Tensor) -> torch.Tensor:
    """A device tensor's copy in (pageable) host memory, through pinned memory.

    A float32 map at the image's size is megabytes (1280x720: 3.7 MB), which a direct copy to
    pageable memory moves through the driver's staging buffers; the copy into pinned memory
    (:func:`~libreyolo.graphs.capture.to_host`) runs at the link's speed and torch's multi-threaded
    copy then moves it out, so that the pinned block goes back to torch's allocator instead of
    living on in the results (the same trade as the predictor's uploads). With a single torch
    thread, or on the CPU, it is a plain ``.cpu()``. The numbers are the same either way.
    """
    if t.device.type != "cuda" or torch.get_num_threads() < STAGE_MIN_THREADS:
        return t.cpu()
    from ...graphs.capture import to_host
    pinned = to_host(t).wait()
    return torch.empty(pinned.shape, dtype=pinned.dtype).copy_(pinned)


#: the resizes whose network input is the whole image, unpadded: the map is resized back as it is
WHOLE_IMAGE_MODES = ("stretch", "cover")


def check_resize(mode: str) -> None:
    """The map is resized back to the image whole, which undoes only a resize of the whole image
    without padding or cropping ("stretch", "cover")."""
    if mode not in WHOLE_IMAGE_MODES:
        raise ValueError(f"the depth task resizes its whole output back to the image, so it needs a preprocess "
                         f"resize of the whole image without padding ({', '.join(WHOLE_IMAGE_MODES)}); "
                         f"this model's preprocess resize is {mode!r}")


class DepthPlan(PredictPlan):
    """One depth predict call (see the module docstring)."""

    tag = ("depth",)

    def __init__(self, model):
        self.model = model

    def finish(self, depth, *extra):
        return depth[:, 0]

    def to_source(self, depth, hw):
        return resize_depth(depth, *hw)

    def results(self, out, chunk, size, speed):
        from ...results import Results
        m = self.model
        maps = [resize_depth(out[i:i + 1], int(it.image.shape[0]), int(it.image.shape[1]))[0]
                for i, it in enumerate(chunk)]
        return [Results(it.image, it.name, m.names, None, speed=dict(speed), depth=DepthMap(data))
                for it, data in zip(chunk, host_views(maps, download))]


# --------------------------------------------------------------------------------------------------
# Training: alignment, loss, metrics.

def align_scale_shift(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``s * pred + t`` per image, with (s, t) the least-squares fit of ``pred`` to ``target`` over
    the ``valid`` pixels (MiDaS's alignment), for (B, H, W) maps. Closed form from five masked
    sums per image (no host synchronisation, no data-dependent shapes: graph-safe); an image
    whose valid predictions are all equal (no scale to fit) gets s = 0 and t = the target's mean.
    The fit is differentiable: the loss's gradient flows through (s, t) as well."""
    m = valid.to(pred.dtype).flatten(1)
    p, g = pred.flatten(1), target.to(pred.dtype).flatten(1)
    n = m.sum(1)
    sp, sg = (m * p).sum(1), (m * g).sum(1)
    spp, spg = (m * p * p).sum(1), (m * p * g).sum(1)
    det = n * spp - sp * sp
    ok = det > 1e-12 * n.clamp_min(1) ** 2
    safe = torch.where(ok, det, torch.ones_like(det))
    s = torch.where(ok, (n * spg - sp * sg) / safe, torch.zeros_like(det))
    t = torch.where(ok, (spp * sg - sp * spg) / safe, sg / n.clamp_min(1))
    return s[:, None, None] * pred + t[:, None, None]


class ScaleShiftInvariantLoss(nn.Module):
    """Mean absolute error of the scale-and-shift-aligned disparity (:func:`align_scale_shift`)
    over the valid pixels of the batch (a batch with none gives 0, not NaN). The network's
    (B, 1, S, S) output against (B, S, S) disparity and its (B, S, S) valid mask; the division is
    by a device count: graph-safe."""

    item_names = ("ssi",)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pred = pred.float()[:, 0]
        m = valid.to(pred.dtype)
        err = (align_scale_shift(pred, target, valid) - target).abs() * m
        loss = err.sum() / m.sum().clamp_min(1)
        return loss, loss.detach().reshape(1)


def depth_metrics(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-batch sums of (AbsRel, delta1 hits, counted pixels) of the aligned disparity against
    the target over the valid pixels: AbsRel = |a - g| / g, delta1 = max(a / g, g / a) < 1.25
    (aligned values are clamped to a small positive floor first)."""
    a = align_scale_shift(pred.float(), target, valid).clamp_min(1e-6)
    g = target.float().clamp_min(1e-6)
    m = valid.to(a.dtype)
    absrel = ((a - g).abs() / g * m).sum()
    hits = ((torch.maximum(a / g, g / a) < 1.25).to(a.dtype) * m).sum()
    return absrel, hits, m.sum()


class DepthEvaluator(Evaluator):
    """Accumulates AbsRel and delta1 of a validation split (at the network's input size, each
    prediction aligned to its target: :func:`depth_metrics`)."""

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None

    def process(self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]) -> None:
        dev = outputs.device
        target, valid = batch[1].to(dev, non_blocking=True), batch[2].to(dev, non_blocking=True)
        sums = torch.stack(depth_metrics(outputs[:, 0], target, valid)).double()
        self.sums = sums if self.sums is None else self.sums + sums

    def evaluate(self) -> dict[str, Any]:
        if self.sums is None or float(self.sums[2]) == 0:
            return {"delta1": float("nan"), "abs_rel": float("nan")}
        absrel, hits, n = (float(v) for v in self.sums.cpu())
        return {"delta1": hits / n, "abs_rel": absrel / n}


@dataclass
class DepthOptions(TaskOptions):
    """Depth training options: augmentation (flip and colour jitter; see :class:`~.data.DepthDataset`)."""

    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    color_jitter: float = option(0.3, "brightness / contrast / saturation jitter strength", Float(0.0))

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


class DepthTask(Task):
    name = "depth"
    primary_metric = "delta1"
    Options = DepthOptions
    predict_defaults: dict = {}

    def plan(self, model, size, constants, **opts) -> DepthPlan:
        check_resize(model.preprocess.resize)
        return DepthPlan(model)

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_depth_data
        return resolve_depth_data(data)

    def datasets(self, data, imgsz, model, options: DepthOptions):
        from .data import DepthDataset, check_samples, collate_depth
        options.check()
        check_resize(model.preprocess.resize)
        check_samples(data)   # every content problem of both splits in one error, before any epoch
        kw = dict(target=data.target, png_scale=data.png_scale)
        train = DepthDataset(data.train, imgsz, augment=True, fliplr=options.fliplr,
                             color_jitter=options.color_jitter, **kw)
        val = DepthDataset(data.val, imgsz, augment=False, **kw)
        return train, val, collate_depth

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: DepthOptions) -> DepthEvaluator:
        return DepthEvaluator()

    def metric_columns(self, metrics) -> dict[str, float]:
        return {"metrics/delta1": metrics["delta1"], "metrics/abs_rel": metrics["abs_rel"]}

    def summary(self, metrics) -> str:
        return f"delta1 {metrics['delta1']:.4f}  abs_rel {metrics['abs_rel']:.4f}"

    def empty_metrics(self) -> dict[str, float]:
        return {"delta1": float("nan"), "abs_rel": float("nan")}

    # ------------------------------------------------------------------ loss
    def build_loss(self, model) -> nn.Module:
        return ScaleShiftInvariantLoss()
