"""Point detection: one point (x, y, class, confidence) per object, from a centroid heat map.

The network (FOMO) gives per cell of a grid at 1/``stride`` of the input the logits of
background and of each class. Predict stage (on the device, fixed shapes, so it can live in the
captured stage as detection's top-k does; :func:`point_candidates`): softmax over the channels;
per cell its best class and that class's probability; a cell is a peak when its best class's
probability is the largest of that class within ``nms_radius`` cells (a max-pool; 0: every
cell); the ``max_det`` best peaks (a top-k; non-peaks score -1) become points at their cells'
centres ``((col + 0.5) * stride, (row + 0.5) * stride)`` in input pixels. On the host the
candidates with score >= ``conf`` (and of ``classes``) are mapped back to each image's pixels and
become ``Results.points`` (:class:`~.results.Points`).

Training: YOLO detection labels (box centres) or point labels, and the built-in
``shapes-point`` set (:mod:`.data`, :mod:`.synthetic`); the loss is FOMO's per-cell
classification (:class:`CentroidLoss`: cross-entropy over background + classes per cell, object
cells weighted ``fg_weight`` times the background's). Validation matches the predicted points to
the labelled ones within ``val_radius`` pixels of the network input (:mod:`.metrics`) and reports
precision, recall and F1 (fitness: F1).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...options import Float, Fraction, Int, check_fields, option
from ..base import Evaluator, PredictPlan, Task, TaskOptions
from .results import Points

__all__ = ["CentroidLoss", "PointEvaluator", "PointOptions", "PointPlan", "PointTask", "point_candidates"]

#: the weight of an object cell against a background cell in the loss (Edge Impulse's FOMO: 100)
FG_WEIGHT = 100.0


def point_candidates(logits: torch.Tensor, k: int, nms_radius: int, stride: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 1 + nc, h, w) centroid-map logits -> the ``k`` best peaks (at most h * w), best first:
    xy (B, k, 2) float32 cell centres in input pixels, score (B, k) float32 (a peak's class
    probability; -1 for a cell that is no peak) and cls (B, k) int64. Fixed shapes, no host
    synchronisation (graph-safe)."""
    p = logits.float().softmax(1)[:, 1:]
    best, cls = p.max(1)
    if nms_radius > 0:
        local = F.max_pool2d(p, 2 * nms_radius + 1, stride=1, padding=nms_radius)
        peak = (p >= local).gather(1, cls[:, None])[:, 0]
        best = torch.where(peak, best, torch.full_like(best, -1.0))
    h, w = int(best.shape[-2]), int(best.shape[-1])
    score, idx = best.flatten(1).topk(min(int(k), h * w), dim=1)
    col, row = idx % w, torch.div(idx, w, rounding_mode="floor")
    xy = torch.stack(((col.float() + 0.5) * stride, (row.float() + 0.5) * stride), -1)
    return xy, score, cls.flatten(1).gather(1, idx)


def kept(score: np.ndarray, cls: np.ndarray, conf: float, classes: list[int] | None) -> np.ndarray:
    """Indices of one image's candidates (sorted by score) with score >= ``conf``, in ``classes``."""
    keep = score >= conf
    if classes is not None:
        keep &= np.isin(cls, classes)
    return np.flatnonzero(keep)


def to_image(xy: np.ndarray, h: int, w: int, size: int, resize: str) -> np.ndarray:
    """(n, 2) input-canvas points -> an (h, w) image's pixels, in place (the resize undone)."""
    from ...ops.letterbox import inverse_params
    sx, sy, px, py = inverse_params(h, w, size, resize)
    xy[:, 0] = (xy[:, 0] - px) / sx
    xy[:, 1] = (xy[:, 1] - py) / sy
    return xy


class PointPlan(PredictPlan):
    """One point predict call (see the module docstring)."""

    def __init__(self, model, *, conf: float, max_det: int, classes: list[int] | None, nms_radius: int):
        self.model = model
        self.conf, self.max_det, self.classes, self.nms_radius = float(conf), int(max_det), classes, int(nms_radius)
        self.tag = ("point", self.max_det, self.nms_radius)

    def finish(self, logits, *extra):
        if isinstance(logits, (tuple, list)):   # an ONNX graph's outputs (export.onnx.RawGraph): the logits alone
            (logits,) = logits
        return point_candidates(logits, self.max_det, self.nms_radius, int(self.model.STRIDE))

    def results(self, out, chunk, size, speed):
        from ...results import Results
        m = self.model
        xy, score, cls = (t.detach().cpu() for t in out[:3])
        xy, score, cls = xy.float().numpy(), score.float().numpy(), cls.numpy()
        results = []
        for i, it in enumerate(chunk):
            idx = kept(score[i], cls[i], self.conf, self.classes)[: self.max_det]
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            pts = to_image(xy[i][idx].astype(np.float32), h, w, size, m.preprocess.resize)
            rows = np.concatenate([pts, score[i][idx, None], cls[i][idx, None].astype(np.float32)], 1)
            results.append(Results(it.image, it.name, m.names, None, speed=dict(speed),
                                   points=Points(torch.from_numpy(np.ascontiguousarray(rows, np.float32)), (h, w))))
        return results


class CentroidLoss(nn.Module):
    """FOMO's loss: per cell, cross-entropy of the (1 + nc) logits against the centroid grid (0
    background, 1 + class where a point falls), object cells weighted ``fg_weight`` times the
    background's, averaged over the cells. Fixed shapes: graph-safe."""

    item_names = ("ce",)

    def __init__(self, fg_weight: float = FG_WEIGHT):
        super().__init__()
        self.fg_weight = float(fg_weight)

    def forward(self, logits: torch.Tensor, grid: torch.Tensor, *rest: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.shape[-2:] != grid.shape[-2:]:
            raise ValueError(f"the network's grid {tuple(logits.shape[-2:])} differs from the target grid "
                             f"{tuple(grid.shape[-2:])}")
        ce = F.cross_entropy(logits.float(), grid, reduction="none")
        weight = torch.where(grid > 0, torch.full_like(ce, self.fg_weight), torch.ones_like(ce))
        loss = (ce * weight).mean()
        return loss, loss.detach().reshape(1)


class PointEvaluator(Evaluator):
    """Precision, recall and F1 of a validation split at ``val_radius`` pixels of the network
    input (:func:`~.metrics.point_counts`), with the predict stage's peaks above ``val_conf``."""

    def __init__(self, model, options: PointOptions):
        self.model, self.options = model, options
        self.stage_tag = ("point", options.max_det, options.val_nms_radius)
        self.reset()

    def reset(self) -> None:
        nc = int(self.model.nc)
        self.tp, self.fp, self.fn = (np.zeros(nc, np.int64) for _ in range(3))
        self.dist = 0.0

    def finish(self, outputs):
        return point_candidates(outputs, self.options.max_det, self.options.val_nms_radius, int(self.model.STRIDE))

    def process(self, outputs, batch) -> None:
        from .metrics import point_counts
        xy, score, cls = (t.detach().cpu() for t in outputs[:3])
        xy, score, cls = xy.float().numpy(), score.float().numpy(), cls.numpy()
        images, _, gcls, gpts, mask = batch
        size = np.array([images.shape[-1], images.shape[-2]], np.float64)
        for i in range(len(images)):
            keep = kept(score[i], cls[i], self.options.val_conf, None)
            m = mask[i].numpy()
            tp, fp, fn, d = point_counts(xy[i][keep].astype(np.float64), cls[i][keep], gpts[i].numpy()[m] * size,
                                         gcls[i].numpy()[m], self.options.val_radius, len(self.tp))
            self.tp += tp
            self.fp += fp
            self.fn += fn
            self.dist += d

    def evaluate(self) -> dict[str, float]:
        from .metrics import prf
        tp, fp, fn = int(self.tp.sum()), int(self.fp.sum()), int(self.fn.sum())
        p, r, f1 = prf(tp, fp, fn)
        return {"f1": f1, "precision": p, "recall": r, "mean_distance": self.dist / tp if tp else float("nan"),
                "tp": float(tp), "fp": float(fp), "fn": float(fn)}


@dataclass
class PointOptions(TaskOptions):
    """Point training options: flip augmentation, target padding, validation's operating point."""

    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    bucket: int = option(16, "points padded to this times a power of two (fixed target shapes)", Int(1))
    val_conf: float = option(0.25, "confidence threshold of validation (a point's class probability)", Fraction())
    val_radius: float = option(12.0, "point: a prediction within this many pixels of the network input from a "
                                     "labelled point of its class matches it (12: 1.5 cells of FOMO's 8-pixel grid)",
                               Float(0.0, min_inclusive=False))
    val_nms_radius: int = option(1, "point: cells within which validation keeps one peak per class (predict's "
                                    "nms_radius)", Int(0))
    max_det: int = option(300, "points kept per image in validation", Int(1))

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


class PointTask(Task):
    name = "point"
    primary_metric = "f1"
    Options = PointOptions
    predict_defaults = {"conf": 0.25, "max_det": 300, "classes": None, "nms_radius": 1}

    def plan(self, model, size, constants, **opts) -> PointPlan:
        from ...options import check_fraction, check_int, check_max_det, parse_classes
        unknown = set(opts) - set(self.predict_defaults)
        if unknown:
            raise ValueError(f"unknown point predict option(s) {', '.join(sorted(unknown))}; "
                             f"options: {', '.join(self.predict_defaults)}")
        o = {**self.predict_defaults, **opts}
        max_det, _ = check_max_det(o["max_det"], None)
        return PointPlan(model, conf=check_fraction("conf", o["conf"]), max_det=max_det,
                         classes=parse_classes(o["classes"], model.names),
                         nms_radius=check_int("nms_radius", o["nms_radius"], 0))

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_point_data
        return resolve_point_data(data)

    def datasets(self, data, imgsz, model, options: PointOptions):
        from .data import PointDataset
        val, collate = self.val_dataset(data, imgsz, model, options)
        train = PointDataset(data.train, imgsz, model.preprocess, augment=True, fliplr=options.fliplr)
        return train, val, collate

    def val_dataset(self, data, imgsz, model, options: PointOptions):
        from .data import PointDataset, collate_point
        options.check()
        val = PointDataset(data.val, imgsz, model.preprocess)
        return val, functools.partial(collate_point, stride=int(model.STRIDE), bucket=options.bucket)

    def target_rows(self, targets) -> int:
        return int(targets[1].shape[1])     # cls (B, M): the bucketed M

    def pad_target_rows(self, targets, rows: int) -> list:
        grid, cls, pts, mask = targets
        more = rows - cls.shape[1]
        if more < 0:
            raise ValueError(f"cannot pad {cls.shape[1]} target rows to {rows}")
        return [grid, F.pad(cls, (0, more)), F.pad(pts, (0, 0, 0, more)), F.pad(mask, (0, more), value=False)]

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: PointOptions) -> PointEvaluator:
        return PointEvaluator(model, options)

    def metric_columns(self, metrics) -> dict[str, float]:
        return {f"metrics/{k}": metrics[k] for k in ("f1", "precision", "recall", "mean_distance")}

    def empty_metrics(self) -> dict[str, float]:
        return {"f1": float("nan"), "precision": float("nan"), "recall": float("nan"),
                "mean_distance": float("nan")}

    def summary(self, metrics) -> str:
        return (f"F1 {metrics['f1']:.4f}  P {metrics['precision']:.4f}  R {metrics['recall']:.4f}  "
                f"dist {metrics['mean_distance']:.2f} px")

    # ------------------------------------------------------------------ loss
    def build_loss(self, model) -> nn.Module:
        return CentroidLoss(getattr(model, "FG_WEIGHT", FG_WEIGHT))
