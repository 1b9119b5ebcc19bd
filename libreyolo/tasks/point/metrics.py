"""Point-detection metrics: precision, recall and F1 at a pixel radius.

Per image and class, predicted points are matched one-to-one to labelled points by the optimal
assignment of their Euclidean distances (scipy's ``linear_sum_assignment``, the Hungarian
method), allowing only pairs within ``radius`` pixels: a matched pair is a true positive, an
unmatched prediction a false positive, an unmatched label a false negative. The assignment
maximises the number of matches first (pairs beyond the radius cost more than any set of pairs
within it) and then minimises their total distance.
"""
from __future__ import annotations

import numpy as np

__all__ = ["match_points", "point_counts", "prf"]


def match_points(pred: np.ndarray, gt: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """(n, 2) predicted and (m, 2) labelled points -> (pred index, gt index) arrays of the pairs
    within ``radius`` of the assignment that matches the most of them at the least total distance."""
    from scipy.optimize import linear_sum_assignment
    if len(pred) == 0 or len(gt) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    d = np.linalg.norm(pred[:, None, :].astype(np.float64) - gt[None, :, :].astype(np.float64), axis=-1)
    within = d <= radius
    # a pair beyond the radius costs more than all allowed pairs together, so no assignment trades
    # a match for a shorter total distance
    big = (radius + 1.0) * (min(len(pred), len(gt)) + 1)
    rows, cols = linear_sum_assignment(np.where(within, d, big))
    keep = within[rows, cols]
    return rows[keep].astype(np.int64), cols[keep].astype(np.int64)


def point_counts(pred_xy: np.ndarray, pred_cls: np.ndarray, gt_xy: np.ndarray, gt_cls: np.ndarray,
                 radius: float, nc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """One image's per-class true positives, false positives and false negatives ((nc,) int64
    each) and the summed distance of its true positives (matching within each class)."""
    tp, fp, fn = (np.zeros(nc, np.int64) for _ in range(3))
    dist = 0.0
    for c in np.union1d(pred_cls, gt_cls).astype(np.int64):
        p, g = pred_xy[pred_cls == c], gt_xy[gt_cls == c]
        i, j = match_points(p, g, radius)
        tp[c] += len(i)
        fp[c] += len(p) - len(i)
        fn[c] += len(g) - len(j)
        if len(i):
            dist += float(np.linalg.norm(p[i] - g[j], axis=-1).sum())
    return tp, fp, fn, dist


def prf(tp: float, fp: float, fn: float) -> tuple[float, float, float]:
    """(precision, recall, F1) of the counts; 0 where a ratio has nothing to count."""
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f1
