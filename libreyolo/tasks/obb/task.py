"""Oriented boxes: rotated boxes (centre, size, angle) per object, in original-image pixels.

The contract with a family (any family: the task knows nothing of one): its ``infer`` returns
fixed-shape candidates sorted by score - ``xywhr`` (B, K, 5) in canvas pixels with the angle in
radians, scores (B, K), classes (B, K). A set-prediction family (``NMS = False``, RT-DETRv2-OBB)
gives its top-k and nothing more runs; a dense one (``NMS = True``) gets the rotated NMS of
:func:`~.rotated.rotated_nms` on the device, in the stage (fixed shapes: suppressed candidates'
scores become 0); such a family's ``infer`` returns its top candidates only (hundreds, as the
detection task's ``max_nms``), since the greedy walk is one small step per candidate. On the host
the candidates above ``conf`` (at most ``max_det``) are mapped back to each image and become
``Results.obb``.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...ops.letterbox import inverse_params
from ...options import Fraction, Int, check_fields, option
from ..base import Evaluator, PredictPlan, Task, TaskOptions
from .results import OBB
from .rotated import corners_to_xywhr, rotated_nms, xywhr_to_corners_np


@dataclass
class ObbOptions(TaskOptions):
    """Oriented-box training options: flip augmentation, target padding, validation threshold."""

    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    bucket: int = option(16, "objects padded to this times a power of two (fixed loss shapes)", Int(1))
    val_conf: float = option(0.001, "confidence threshold of validation", Fraction())

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


def suppress(outputs, iou: float, agnostic: bool):
    """A dense family's candidates after rotated NMS: the suppressed ones' scores set to 0 (fixed
    shapes; the order stays the score order)."""
    xywhr, scores, cls = outputs
    keep = rotated_nms(xywhr.float(), scores, cls, iou, agnostic)
    return xywhr, torch.where(keep, scores, torch.zeros_like(scores)), cls


class ObbEvaluator(Evaluator):
    """Rotated mAP50 / mAP50-95 of a validation split (:func:`~.metrics.rotated_map`: exact polygon
    IoUs), measured on the network's square input (the images as the stage sees them)."""

    def __init__(self, model, options: ObbOptions, iou: float = 0.45):
        self.model, self.options, self.iou = model, options, float(iou)
        self.reset()

    @property
    def stage_tag(self) -> tuple:
        return ("obb-nms", self.iou) if self.model.NMS else ()

    def reset(self) -> None:
        self.preds: list[dict] = []
        self.gts: list[dict] = []

    def finish(self, outputs):
        return suppress(outputs, self.iou, False) if self.model.NMS else outputs

    def process(self, outputs, batch) -> None:
        xywhr, scores, cls = (t.detach().float().cpu().numpy() for t in outputs)
        images, gcls, gboxes, mask = batch
        size = float(images.shape[-1])
        for i in range(len(images)):
            keep = scores[i] >= self.options.val_conf
            self.preds.append({"xywhr": xywhr[i][keep], "scores": scores[i][keep], "cls": cls[i][keep]})
            m = mask[i].numpy()
            g = gboxes[i].numpy()[m].astype(np.float64)
            g[:, :4] *= size
            self.gts.append({"xywhr": g, "cls": gcls[i].numpy()[m]})

    def evaluate(self) -> dict[str, float]:
        from .metrics import rotated_map
        return rotated_map(self.preds, self.gts)


def unletterbox_xywhr(rows: np.ndarray, sx: float, sy: float, pad_x: int = 0, pad_y: int = 0) -> np.ndarray:
    """(n, 5) canvas rotated boxes -> an image's pixels (corners mapped back, the rectangle refitted
    where the two axes' scales differ)."""
    if len(rows) == 0:
        return rows.reshape(0, 5)
    if abs(sx - sy) <= 1e-9 * max(sx, sy):
        out = rows.astype(np.float64).copy()
        out[:, 0] = (out[:, 0] - pad_x) / sx
        out[:, 1] = (out[:, 1] - pad_y) / sy
        out[:, 2:4] /= sx
        return out
    pts = xywhr_to_corners_np(rows)
    pts = (pts - np.array([pad_x, pad_y])) / np.array([sx, sy])
    return corners_to_xywhr(pts)


class ObbPlan(PredictPlan):
    """One oriented-box predict call (see the module docstring)."""

    def __init__(self, model, constants: Callable[..., torch.Tensor], *, conf: float, iou: float, max_det: int,
                 classes: list[int] | None, agnostic_nms: bool):
        self.model = model
        self.conf, self.iou, self.max_det, self.classes = float(conf), float(iou), int(max_det), classes
        self.agnostic = bool(agnostic_nms)
        self.tag = ("obb-nms", self.iou, self.agnostic) if model.NMS else ()

    def finish(self, outputs, *extra):
        return suppress(outputs, self.iou, self.agnostic) if self.model.NMS else outputs

    def results(self, out, chunk, size, speed):
        from ...results import Results
        m = self.model
        xywhr, scores, cls = (t.detach().double().cpu().numpy() for t in out)
        results = []
        for i, it in enumerate(chunk):
            keep = scores[i] >= self.conf
            if self.classes is not None:
                keep &= np.isin(cls[i], self.classes)
            idx = np.flatnonzero(keep)[: self.max_det]     # sorted by score already
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
            rows = unletterbox_xywhr(xywhr[i][idx], sx, sy, px, py)
            data = np.concatenate([rows, scores[i][idx, None], cls[i][idx, None]], 1).astype(np.float32)
            results.append(Results(it.image, it.name, m.names, None, speed=dict(speed),
                                   obb=OBB(torch.from_numpy(np.ascontiguousarray(data)), (h, w))))
        return results


class ObbTask(Task):
    name = "obb"
    primary_metric = "map50_95"
    Options = ObbOptions
    val_option_names = {"conf": "val_conf"}
    predict_defaults = {"conf": 0.25, "iou": 0.45, "max_det": 300, "classes": None, "agnostic_nms": False}

    def plan(self, model, size, constants, **opts) -> ObbPlan:
        from ...options import check_fraction, check_max_det, parse_classes
        unknown = set(opts) - set(self.predict_defaults)
        if unknown:
            raise ValueError(f"unknown obb predict option(s) {', '.join(sorted(unknown))}; "
                             f"options: {', '.join(self.predict_defaults)}")
        o = {**self.predict_defaults, **opts}
        max_det, _ = check_max_det(o["max_det"], None)
        plan = ObbPlan(model, constants, conf=check_fraction("conf", o["conf"]), iou=check_fraction("iou", o["iou"]),
                       max_det=max_det, classes=parse_classes(o["classes"], model.names),
                       agnostic_nms=bool(o["agnostic_nms"]))
        plan.reusable = not isinstance(o["classes"], str)   # class names: read from the model's names each call
        return plan

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_obb_data
        return resolve_obb_data(data)

    def datasets(self, data, imgsz, model, options: ObbOptions):
        from .data import ObbDataset, collate_obb
        train = ObbDataset(data.train, imgsz, model.preprocess, augment=True, fliplr=options.fliplr)
        val = ObbDataset(data.val, imgsz, model.preprocess)
        return train, val, functools.partial(collate_obb, bucket=options.bucket)

    def target_rows(self, targets) -> int:
        return int(targets[0].shape[1])     # cls (B, M): the bucketed M

    def pad_target_rows(self, targets, rows: int) -> list:
        import torch.nn.functional as F
        cls, boxes, mask = targets
        more = rows - cls.shape[1]
        if more < 0:
            raise ValueError(f"cannot pad {cls.shape[1]} target rows to {rows}")
        return [F.pad(cls, (0, more)), F.pad(boxes, (0, 0, 0, more)), F.pad(mask, (0, more), value=False)]

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: ObbOptions) -> ObbEvaluator:
        return ObbEvaluator(model, options)

    def fitness(self, metrics) -> float:
        def nz(v):
            return 0.0 if v is None or v != v else float(v)
        return 0.1 * nz(metrics.get("map50")) + 0.9 * nz(metrics.get("map50_95"))

    def empty_metrics(self) -> dict[str, float]:
        return {"map50": float("nan"), "map50_95": float("nan")}

    def summary(self, metrics) -> str:
        return f"rotated mAP50 {metrics['map50']:.4f}  mAP50-95 {metrics['map50_95']:.4f}"
