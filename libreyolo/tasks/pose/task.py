"""Pose estimation (keypoints): per-instance boxes and keypoints in original-image pixels.

Predict stage (on the device, captured with the network where the family declares graphs): the
family's ``infer`` returns fixed-shape candidates sorted by score - boxes (B, K, 4) xyxy, scores
(B, K), classes (B, K) and keypoints (B, K, N, 2) in canvas pixels (a DETR-style family: a top-k
over the queries, no NMS). On the host the candidates above ``conf`` (at most ``max_det``) are
mapped back to each image's pixels and become ``Results.boxes`` and ``Results.keypoints``.

The keypoint layout (``kpt_shape``), left/right flip order (``flip_idx``) and ``skeleton`` come
from the checkpoint's metadata (a pose dataset's YAML), else COCO's 17-keypoint person layout.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ...ops.letterbox import inverse_params, unletterbox_boxes
from ..base import PredictPlan, Task
from .results import Keypoints


def skeleton_of(model) -> tuple | None:
    """The checkpoint's ``skeleton`` metadata (pairs of keypoint indices), else None (the default)."""
    meta = getattr(model, "meta", None) or {}
    sk = meta.get("skeleton")
    return None if sk is None else tuple(tuple(int(i) for i in pair) for pair in sk)


def unletterbox_keypoints(kpts: np.ndarray, sx: float, sy: float, pad_x: int = 0, pad_y: int = 0) -> np.ndarray:
    """(n, K, 2+) canvas keypoints -> an image's pixels, in place (not clipped: a keypoint may lie
    outside the image)."""
    kpts[..., 0] = (kpts[..., 0] - pad_x) / sx
    kpts[..., 1] = (kpts[..., 1] - pad_y) / sy
    return kpts


class PosePlan(PredictPlan):
    """One pose predict call (see the module docstring)."""

    def __init__(self, model, constants: Callable[..., torch.Tensor], *, conf: float, max_det: int,
                 classes: list[int] | None):
        self.model = model
        self.conf, self.max_det, self.classes = float(conf), int(max_det), classes

    def finish(self, outputs, *extra):
        return outputs    # the family's infer is already the fixed-shape top-k

    def results(self, out, chunk, size, speed):
        from ...results import Boxes, Results
        m = self.model
        boxes, scores, cls, kpts = (t.detach().float().cpu().numpy() for t in out)
        skeleton = skeleton_of(m)
        results = []
        for i, it in enumerate(chunk):
            keep = scores[i] >= self.conf
            if self.classes is not None:
                keep &= np.isin(cls[i], self.classes)
            idx = np.flatnonzero(keep)[: self.max_det]     # sorted by score already
            det = np.concatenate([boxes[i][idx], scores[i][idx, None], cls[i][idx, None]], 1).astype(np.float32)
            pts = kpts[i][idx].astype(np.float32)
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
            unletterbox_boxes(det, sx, sy, h, w, px, py)
            unletterbox_keypoints(pts, sx, sy, px, py)
            # no visibility output: each keypoint carries its instance's score
            pts = np.concatenate([pts, np.repeat(det[:, None, 4:5], pts.shape[1], 1)], 2)
            results.append(Results(it.image, it.name, m.names, Boxes(torch.from_numpy(det), (h, w)),
                                   speed=dict(speed),
                                   keypoints=Keypoints(torch.from_numpy(np.ascontiguousarray(pts)), (h, w),
                                                       skeleton)))
        return results


class PoseTask(Task):
    name = "pose"
    primary_metric = "oks_map50_95"
    predict_defaults = {"conf": 0.25, "max_det": 300, "classes": None}

    def plan(self, model, size, constants, **opts) -> PosePlan:
        from ...options import check_fraction, check_max_det, parse_classes
        unknown = set(opts) - set(self.predict_defaults)
        if unknown:
            raise ValueError(f"unknown pose predict option(s) {', '.join(sorted(unknown))}; "
                             f"options: {', '.join(self.predict_defaults)}")
        o = {**self.predict_defaults, **opts}
        max_det, _ = check_max_det(o["max_det"], None)
        return PosePlan(model, constants, conf=check_fraction("conf", o["conf"]), max_det=max_det,
                        classes=parse_classes(o["classes"], model.names))
