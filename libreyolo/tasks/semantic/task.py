"""Semantic segmentation: a class per pixel, cross-entropy, mIoU.

Predict stage (on the device, captured): ``model.infer`` gives class logits (B, nc, S, S) at the
network's input size (the family upsamples them); the stage takes the argmax over the classes
and returns a compact integer class map (uint8 for up to 256 classes). After the stage, each
image's map is cut to the part of the square its image covers (letterbox modes) and resized to
the image's (h, w) by nearest neighbour, on the device; the maps of a chunk then reach the host
in one copy and become ``Results.masks`` (:class:`~.results.SemanticMask`).

Training: images + PNG masks or the built-in ``shapes-seg`` set (:mod:`.data`), joint
torchvision.transforms.v2 augmentation, fixed-shape batches (uint8 images, int64 masks with
:data:`~.data.IGNORE` = -1 for ignored pixels); cross-entropy over the counted pixels; validation
mIoU (fitness), pixel accuracy and per-class IoU from a confusion matrix built on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...options import Float, Fraction, Int, OptionError, check_fields, option
from ..base import PredictPlan, Task, TaskOptions, host_views
from .maps import IGNORE, check_resize
from .metrics import SemanticEvaluator


def class_map_dtype(nc: int) -> torch.dtype:
    """The smallest integer dtype that holds class ids 0..nc-1 (uint8 up to 256 classes)."""
    if nc <= 256:
        return torch.uint8
    return torch.int16 if nc <= 32768 else torch.int32


@dataclass
class SemanticOptions(TaskOptions):
    """Semantic-segmentation training options: augmentation and the ignored mask value."""

    scale_min: float = option(0.5, "smallest random scale of the image relative to the network's square "
                                   "(SegFormer's ratio range 0.5-2.0), then a random crop",
                              Float(0.0, min_inclusive=False))
    scale_max: float = option(2.0, "largest random scale of the image", Float(0.0, min_inclusive=False))
    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    color_jitter: float = option(0.3, "brightness / contrast / saturation in [1 - s, 1 + s], hue +- s / 4",
                                 Float(0.0))
    ignore_index: int | None = option(None, "mask value that is not a class (default: the dataset's, else 255)",
                                      Int(0, none=True))

    def __post_init__(self) -> None:
        self.validate()

    def check(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_fields(self)
        if not self.scale_min <= self.scale_max:
            raise OptionError(f"scale_min / scale_max must satisfy 0 < scale_min <= scale_max, got "
                              f"{self.scale_min} / {self.scale_max}")


class SemanticLoss(nn.Module):
    """Cross-entropy of (B, nc, S, S) logits against (B, S, S) int64 masks, averaged over the
    pixels that are not :data:`~.data.IGNORE` (a batch with none gives 0, not NaN). The
    division is by a device tensor: no host synchronisation, graph-safe.

    The per-pixel losses are summed by ``Tensor.sum`` rather than by the loss's own
    ``reduction="sum"``: on CUDA that reduction (``nll_loss2d``) accumulates with atomics, so
    its result changes from run to run and a captured step could never equal eager bit for bit;
    a tensor sum is reduced in a fixed order."""

    item_names = ("ce",)

    def forward(self, logits: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = F.cross_entropy(logits.float(), masks, ignore_index=IGNORE, reduction="none").sum()
        loss = total / (masks != IGNORE).sum().clamp_min(1)
        return loss, loss.detach().reshape(1)


class SemanticPlan(PredictPlan):
    """One semantic predict call (see the module docstring)."""

    def __init__(self, model):
        self.model = model
        self.dtype = class_map_dtype(model.nc)
        self.tag = ("argmax", str(self.dtype))

    def finish(self, logits, *extra):
        return logits.argmax(1).to(self.dtype)

    def results(self, out, chunk, size, speed):
        from ...ops.letterbox import image_region
        from ...results import Results
        from .maps import resize_nearest
        from .results import SemanticMask
        m = self.model
        mode = m.preprocess.resize
        maps = []
        for i, it in enumerate(chunk):
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            maps.append(resize_nearest(image_region(out[i], h, w, size, mode), h, w))
        return [Results(it.image, it.name, m.names, None, speed=dict(speed), masks=SemanticMask(data))
                for it, data in zip(chunk, host_views(maps))]


class SemanticTask(Task):
    name = "semantic"
    primary_metric = "miou"
    Options = SemanticOptions
    predict_defaults: dict = {}

    def plan(self, model, size, constants, **opts) -> SemanticPlan:
        check_resize(model.preprocess.resize)
        return SemanticPlan(model)

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_semantic_data
        return resolve_semantic_data(data)

    def datasets(self, data, imgsz, model, options: SemanticOptions):
        from .data import SemanticDataset, check_samples, collate_semantic
        o = options
        o.validate()
        ignore = data.ignore_index if o.ignore_index is None else int(o.ignore_index)
        check_samples(data, ignore)   # every content problem of both splits in one error, before any epoch
        resize = model.preprocess.resize
        train = SemanticDataset(data.train, imgsz, ignore, resize, augment=True, scale=(o.scale_min, o.scale_max),
                                fliplr=o.fliplr, color_jitter=o.color_jitter)
        val = SemanticDataset(data.val, imgsz, ignore, resize, augment=False)
        return train, val, collate_semantic

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: SemanticOptions) -> SemanticEvaluator:
        return SemanticEvaluator(model)

    def metric_columns(self, metrics) -> dict[str, float]:
        return {"metrics/mIoU": metrics["miou"], "metrics/pixel_acc": metrics["pixel_acc"]}

    def summary(self, metrics) -> str:
        return f"mIoU {metrics['miou']:.4f}  pixel_acc {metrics['pixel_acc']:.4f}"

    def empty_metrics(self) -> dict[str, float]:
        return {"miou": float("nan"), "pixel_acc": float("nan")}

    # ------------------------------------------------------------------ loss
    def build_loss(self, model) -> nn.Module:
        return SemanticLoss()
