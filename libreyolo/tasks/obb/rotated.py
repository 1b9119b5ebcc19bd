"""Rotated-box geometry: corners, the probabilistic IoU, a fixed-shape rotated NMS, exact polygon IoU.

A rotated box is ``xywhr``: centre, width, height and the angle (radians) by which the width side
is turned from the x axis (image axes, y down, so a positive angle turns clockwise on screen).

* :func:`probiou` - the probabilistic IoU of the boxes' Gaussians (Llerena et al., "Gaussian
  Bounding Boxes and Probabilistic Intersection-over-Union", 2021): a closed form of elementwise
  tensor operations, differentiable, fixed-shape and synchronisation-free, so it serves the
  training loss, the matcher's cost and NMS inside a captured graph on any device.
* :func:`rotated_nms` - greedy NMS over score-sorted candidates with :func:`probiou` as the
  overlap: torchvision has no rotated NMS (its ``nms`` / ``batched_nms`` take axis-aligned boxes
  only), and the detection task's Triton kernel computes axis-aligned IoU. The walk runs on the
  device over fixed shapes, like the detection stage's.
* :func:`polygon_iou` - the exact IoU of the rotated rectangles as polygons (shapely), on the
  host, for evaluation.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def xywhr_to_corners(xywhr: torch.Tensor) -> torch.Tensor:
    """(..., 5) rotated boxes -> (..., 4, 2) corners, in the order of the width side's start,
    its end, then round the box."""
    c, w, h, a = xywhr[..., :2], xywhr[..., 2:3], xywhr[..., 3:4], xywhr[..., 4:5]
    cos, sin = a.cos(), a.sin()
    wv = torch.cat((cos * w / 2, sin * w / 2), -1)
    hv = torch.cat((-sin * h / 2, cos * h / 2), -1)
    return torch.stack((c - wv - hv, c + wv - hv, c + wv + hv, c - wv + hv), -2)


def xywhr_to_corners_np(xywhr: np.ndarray) -> np.ndarray:
    """:func:`xywhr_to_corners` for numpy arrays."""
    return xywhr_to_corners(torch.from_numpy(np.asarray(xywhr, np.float64))).numpy()


def canonical_xywhr(xywhr: np.ndarray) -> np.ndarray:
    """(n, 5) rotated boxes with the longer side as the width and the angle in [0, pi) (the same
    rectangles; the form the networks predict)."""
    out = np.array(xywhr, np.float64).reshape(-1, 5)
    swap = out[:, 3] > out[:, 2]
    out[swap, 2], out[swap, 3] = out[swap, 3].copy(), out[swap, 2].copy()
    out[swap, 4] += math.pi / 2
    out[:, 4] = np.mod(out[:, 4], math.pi)
    return out


def corners_to_xywhr(corners: np.ndarray) -> np.ndarray:
    """(n, 4, 2) quadrilaterals -> (n, 5) canonical rotated boxes: each quadrilateral's smallest
    enclosing rectangle with a side along one of its edges (the minimum-area rectangle of a convex
    quadrilateral; a labelled rectangle gives itself back)."""
    q = np.asarray(corners, np.float64).reshape(-1, 4, 2)
    if len(q) == 0:
        return np.zeros((0, 5))
    edges = np.roll(q, -1, 1) - q                                   # (n, 4, 2)
    ang = np.arctan2(edges[..., 1], edges[..., 0])                  # (n, 4)
    ux, uy = np.cos(ang), np.sin(ang)
    # extents of the four points along each edge direction and its normal
    pu = q[:, None, :, 0] * ux[..., None] + q[:, None, :, 1] * uy[..., None]      # (n, 4 dirs, 4 pts)
    pv = -q[:, None, :, 0] * uy[..., None] + q[:, None, :, 1] * ux[..., None]
    w, h = pu.max(-1) - pu.min(-1), pv.max(-1) - pv.min(-1)
    best = np.argmin(w * h, 1)
    i = np.arange(len(q))
    a = ang[i, best]
    mu = (pu.max(-1) + pu.min(-1))[i, best] / 2
    mv = (pv.max(-1) + pv.min(-1))[i, best] / 2
    cx, cy = mu * np.cos(a) - mv * np.sin(a), mu * np.sin(a) + mv * np.cos(a)
    return canonical_xywhr(np.stack((cx, cy, w[i, best], h[i, best], a), 1))


def _gaussian(xywhr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The covariance entries (a, b, c) = (var_x, var_y, cov_xy) of each box's Gaussian (a uniform
    distribution's second moments: side^2 / 12)."""
    w2, h2 = xywhr[..., 2].square() / 12, xywhr[..., 3].square() / 12
    cos, sin = xywhr[..., 4].cos(), xywhr[..., 4].sin()
    cos2, sin2 = cos.square(), sin.square()
    return w2 * cos2 + h2 * sin2, w2 * sin2 + h2 * cos2, (w2 - h2) * cos * sin


def probiou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Probabilistic IoU of rotated boxes (broadcasting over the leading dimensions):
    ``1 - Hellinger distance`` of their Gaussians, in [0, 1]."""
    x1, y1 = box1[..., 0], box1[..., 1]
    x2, y2 = box2[..., 0], box2[..., 1]
    a1, b1, c1 = _gaussian(box1)
    a2, b2, c2 = _gaussian(box2)
    a, b, c = a1 + a2, b1 + b2, c1 + c2
    den = a * b - c.square() + eps
    t1 = (a * (y1 - y2).square() + b * (x1 - x2).square()) / den * 0.25
    t2 = (c * (x2 - x1) * (y1 - y2)) / den * 0.5
    # each determinant kept above 0 before its square root: a finite gradient for a degenerate box
    det1 = (a1 * b1 - c1.square()).clamp(min=1e-30)
    det2 = (a2 * b2 - c2.square()).clamp(min=1e-30)
    t3 = (den / (4 * det1.sqrt() * det2.sqrt() + eps) + eps).log() * 0.5
    bd = (t1 + t2 + t3).clamp(eps, 100.0)
    hd = (1.0 - (-bd).exp() + eps).sqrt()
    return 1.0 - hd


def rotated_nms(xywhr: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, iou: float,
                agnostic: bool = False) -> torch.Tensor:
    """Greedy NMS of score-sorted candidates (B, K, 5) / (B, K) / (B, K) -> keep (B, K) bool.

    A candidate is dropped when an earlier kept one of the same class (any class with
    ``agnostic``) overlaps it by :func:`probiou` above ``iou``. Every shape is fixed and nothing is
    read on the host: the pair matrix is computed at once, the walk is K steps of elementwise
    tensor operations, so the whole runs inside a captured graph.
    """
    b, k = scores.shape
    ov = probiou(xywhr[:, :, None, :], xywhr[:, None, :, :])            # (B, K, K)
    later = torch.ones(k, k, dtype=torch.bool, device=scores.device).triu(1)
    hit = (ov > iou) & later
    if not agnostic:
        hit &= cls[:, :, None] == cls[:, None, :]
    alive = torch.ones(b, k, dtype=torch.bool, device=scores.device)
    keep = torch.zeros_like(alive)
    for i in range(k):
        ki = alive[:, i]
        keep[:, i] = ki
        alive = alive & ~(hit[:, i] & ki[:, None])
    return keep


def polygon_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact IoU matrix (n, m) of rotated boxes ``a`` (n, 5) and ``b`` (m, 5) as polygons."""
    try:
        import shapely
    except ImportError as e:   # pragma: no cover - depends on the install
        raise ImportError("rotated-box evaluation computes exact polygon IoUs with shapely: "
                          "pip install 'libreyolo-graphs[obb]' (or shapely>=2)") from e
    a = np.asarray(a, np.float64).reshape(-1, 5)
    b = np.asarray(b, np.float64).reshape(-1, 5)
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    pa = shapely.polygons(xywhr_to_corners_np(a))
    pb = shapely.polygons(xywhr_to_corners_np(b))
    inter = shapely.area(shapely.intersection(pa[:, None], pb[None, :]))
    union = (a[:, 2] * a[:, 3])[:, None] + (b[:, 2] * b[:, 3])[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)
