"""Test-time augmentation geometry: the views' input sizes and boxes mapped back.

The views are Ultralytics': the image at the model's size, a horizontal flip, and two smaller
scales (0.83 and 0.67 of the size, rounded up to the stride) so that each scale is one fixed
input shape (one captured stage per scale). Their detections, mapped back to the original
image, are merged with class-aware NMS (:func:`libreyolo.ops.tiles.merge_tiles` with no shift).
"""
from __future__ import annotations

import math

import torch

__all__ = ["TTA_SCALES", "tta_sizes", "unflip_boxes"]

#: the extra scales of test-time augmentation, as fractions of the model's input size
TTA_SCALES = (0.83, 0.67)


def tta_sizes(imgsz: int, stride: int) -> list[int]:
    """The input sizes of the views: ``imgsz`` then each of :data:`TTA_SCALES`, rounded up to ``stride``."""
    if imgsz < 1 or stride < 1:
        raise ValueError(f"tta_sizes: imgsz and stride must be positive, got {imgsz} and {stride}")
    return [imgsz] + [max(stride, math.ceil(imgsz * s / stride) * stride) for s in TTA_SCALES]


def unflip_boxes(boxes: torch.Tensor, width: int | float) -> torch.Tensor:
    """xyxy boxes found on a horizontally flipped image of ``width`` pixels, in the original's coordinates."""
    out = boxes.clone()
    out[..., 0] = width - boxes[..., 2]
    out[..., 2] = width - boxes[..., 0]
    return out
