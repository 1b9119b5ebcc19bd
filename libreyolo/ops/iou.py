"""Box overlap measures for losses and label assigners, fixed-shape and broadcasting.

Every function takes xyxy boxes in the last dimension and broadcasts over the leading ones:
elementwise for equal shapes, pairwise with ``f(a[:, None], b[None])``. They read no value on
the host, so they run inside a CUDA graph. ``torchvision.ops.box_iou`` / ``complete_box_iou``
are pairwise-only and torchvision's CIoU lets the gradient flow through the aspect-ratio
weight; the YOLO losses hold that weight constant, hence these versions.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["bbox_iou", "bbox_ciou", "bbox_overlaps", "bbox_giou", "xyxy_to_cxcywh", "cxcywh_to_xyxy"]


def xyxy_to_cxcywh(boxes: Tensor) -> Tensor:
    """(..., 4) corners -> (..., 4) centre x, centre y, width, height."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), -1)


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """(..., 4) centre x, centre y, width, height -> (..., 4) corners."""
    xy, wh = boxes[..., :2], boxes[..., 2:4]
    return torch.cat((xy - wh / 2, xy + wh / 2), -1)


def _overlap(box1: Tensor, box2: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor]:
    """Both boxes' corners (x1, y1, x2, y2) and their intersection area (clamped at 0)."""
    (b1x1, b1y1, b1x2, b1y2), (b2x1, b2y1, b2x2, b2y2) = box1.unbind(-1), box2.unbind(-1)
    inter = ((torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp_min(0)
             * (torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)).clamp_min(0))
    return (b1x1, b1y1, b1x2, b1y2), (b2x1, b2y1, b2x2, b2y2), inter


def bbox_iou(box1: Tensor, box2: Tensor, eps: float = 1e-16) -> Tensor:
    """Intersection over union, ``inter / (area1 + area2 - inter + eps)``; returns shape ``(...)``.

    ``eps`` only keeps two empty boxes from dividing zero by zero; it is far below any real
    area, so the value is the plain IoU.
    """
    (b1x1, b1y1, b1x2, b1y2), (b2x1, b2y1, b2x2, b2y2), inter = _overlap(box1, box2)
    area1 = (b1x2 - b1x1) * (b1y2 - b1y1)
    area2 = (b2x2 - b2x1) * (b2y2 - b2y1)
    return inter / (area1 + area2 - inter + eps)


def bbox_ciou(box1: Tensor, box2: Tensor, eps: float = 1e-7) -> Tensor:
    """Complete IoU (IoU - centre distance term - aspect-ratio term); returns shape ``(...)``.

    The YOLOv5/v7/v9 formulation: heights get ``+eps`` (degenerate boxes stay finite) and the
    aspect-ratio weight ``alpha`` is a constant for the gradient.
    """
    # widths and heights before the intersection, as in the original: the order of these uses
    # fixes the order in which autograd sums their gradients, hence the last bits of the result
    b1x1, b1y1, b1x2, b1y2 = box1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = box2.unbind(-1)
    w1, h1 = b1x2 - b1x1, b1y2 - b1y1 + eps
    w2, h2 = b2x2 - b2x1, b2y2 - b2y1 + eps
    inter = ((torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp_min(0)
             * (torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)).clamp_min(0))
    iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
    cw = torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)
    ch = torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)
    c2 = cw.square() + ch.square() + eps
    rho2 = ((b2x1 + b2x2 - b1x1 - b1x2).square() + (b2y1 + b2y2 - b1y1 - b1y2).square()) / 4
    v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).square()
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def bbox_overlaps(box1: Tensor, box2: Tensor, mode: str = "iou", eps: float = 1e-6) -> Tensor:
    """IoU or GIoU with the union and the enclosing area floored at ``eps``; returns ``(...)``.

    The convention of mmdetection's and PaddleDetection's ``bbox_overlaps`` (used by the
    RTMDet and PicoDet assigners and losses): areas are signed ``w * h``, the intersection is
    clamped at zero, ``union = max(area1 + area2 - inter, eps)``, and for ``mode="giou"``
    ``enclose = max(enclosing area, eps)`` and the result is ``iou - (enclose - union) / enclose``.
    """
    if mode not in ("iou", "giou"):
        raise ValueError(f"mode must be 'iou' or 'giou', got {mode!r}")
    (b1x1, b1y1, b1x2, b1y2), (b2x1, b2y1, b2x2, b2y2), inter = _overlap(box1, box2)
    area1 = (b1x2 - b1x1) * (b1y2 - b1y1)
    area2 = (b2x2 - b2x1) * (b2y2 - b2y1)
    union = (area1 + area2 - inter).clamp_min(eps)
    iou = inter / union
    if mode == "iou":
        return iou
    enclose = ((torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)).clamp_min(0)
               * (torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)).clamp_min(0)).clamp_min(eps)
    return iou - (enclose - union) / enclose


def bbox_giou(box1: Tensor, box2: Tensor, eps: float = 1e-10) -> Tensor:
    """GIoU as PaddleDetection's ``GIoULoss`` computes it (PicoDet's box loss); returns ``(...)``.

    Unlike :func:`bbox_overlaps` (``mode="giou"``), ``eps`` is added to the union and to the
    enclosing area instead of flooring them, and the enclosing extent is not clamped.
    """
    (b1x1, b1y1, b1x2, b1y2), (b2x1, b2y1, b2x2, b2y2), inter = _overlap(box1, box2)
    union = (b1x2 - b1x1) * (b1y2 - b1y1) + (b2x2 - b2x1) * (b2y2 - b2y1) - inter + eps
    enclose = ((torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1))
               * (torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)) + eps)
    return inter / union - (enclose - union) / enclose
