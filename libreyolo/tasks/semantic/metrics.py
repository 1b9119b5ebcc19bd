"""Semantic-segmentation metrics: a confusion matrix on the device -> mIoU, pixel accuracy, per-class IoU."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..base import Evaluator


def metrics_from_confusion(confusion: np.ndarray, names: dict[int, str]) -> dict[str, Any]:
    """``confusion[t, p]`` = pixels of true class t predicted as p (ignored pixels excluded) ->
    ``{"miou", "pixel_acc", "per_class": {name: IoU}}``.

    IoU of a class = TP / (TP + FP + FN); a class with no pixel in the truth nor the prediction
    has no IoU (NaN) and is left out of the mean. Pixel accuracy = correct / counted pixels.
    Both are NaN when no pixel was counted.
    """
    conf = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(conf)
    union = conf.sum(0) + conf.sum(1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, tp / union, np.nan)
    total = conf.sum()
    counted = ~np.isnan(iou)
    miou = float(iou[counted].mean()) if counted.any() else float("nan")
    pixel_acc = float(tp.sum() / total) if total > 0 else float("nan")
    per_class = {names.get(k, str(k)): float(v) for k, v in enumerate(iou)}
    return {"miou": miou, "pixel_acc": pixel_acc, "per_class": per_class}


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, nc: int) -> torch.Tensor:
    """(nc, nc) int64 counts of (true, predicted) classes over the pixels whose target is a class
    id (>= 0; ignored pixels are negative), computed on the tensors' device with one bincount."""
    target = target.to(device=pred.device, dtype=torch.int64)
    flat = torch.where(target >= 0, target * nc + pred.to(torch.int64), nc * nc)
    return torch.bincount(flat.reshape(-1), minlength=nc * nc + 1)[:nc * nc].view(nc, nc)


class SemanticEvaluator(Evaluator):
    """Accumulates the confusion matrix of a validation split (argmax of the logits against the
    masks, at the network's input size) and returns mIoU, pixel accuracy and per-class IoU."""

    def __init__(self, model):
        self.nc, self.names = int(model.nc), dict(model.names)
        self.reset()

    def reset(self) -> None:
        self.confusion: torch.Tensor | None = None

    def process(self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]) -> None:
        counts = confusion_matrix(outputs.argmax(1), batch[1], self.nc)
        self.confusion = counts if self.confusion is None else self.confusion + counts

    def evaluate(self) -> dict[str, Any]:
        conf = np.zeros((self.nc, self.nc)) if self.confusion is None else self.confusion.cpu().numpy()
        return metrics_from_confusion(conf, self.names)
