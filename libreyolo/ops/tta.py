"""Test-time augmentation geometry: the views' input sizes and boxes mapped back.

The views are Ultralytics': the image at the model's size, at 0.83 of it flipped left-right,
and at 0.67 of it (:data:`TTA_VIEWS`), each size rounded up to the stride so that each view is
one fixed input shape (one captured stage per view). Their detections, mapped back to the
original image (the stage maps each view's boxes to the image's pixels; :func:`unflip_boxes`
undoes the flip), are merged with class-aware NMS
(:func:`libreyolo.ops.tiles.merge_detections`).
"""
from __future__ import annotations

import math

import torch

__all__ = ["TTA_VIEWS", "tta_views", "unflip_boxes"]

#: the views of test-time augmentation: (scale of the model's input size, flipped left-right)
TTA_VIEWS: tuple[tuple[float, bool], ...] = ((1.0, False), (0.83, True), (0.67, False))


def tta_views(imgsz: int, stride: int, views: tuple[tuple[float, bool], ...] = TTA_VIEWS) -> list[tuple[int, bool]]:
    """(input size, flipped) of each view: ``imgsz`` times its scale, rounded up to ``stride``."""
    if imgsz < 1 or stride < 1:
        raise ValueError(f"tta_views: imgsz and stride must be positive, got {imgsz} and {stride}")
    for scale, _ in views:
        if not 0.0 < scale:
            raise ValueError(f"tta_views: a view's scale must be positive, got {scale}")
    return [(max(stride, math.ceil(imgsz * scale / stride) * stride), bool(flip)) for scale, flip in views]


def unflip_boxes(boxes: torch.Tensor, width: int | float) -> torch.Tensor:
    """xyxy boxes (the first four columns) found on a left-right flipped image of ``width``
    pixels, in the original's coordinates (a new tensor; other columns kept)."""
    out = boxes.clone()
    out[..., 0] = width - boxes[..., 2]
    out[..., 2] = width - boxes[..., 0]
    return out
