"""Precision, recall, PR curves and the confusion matrix of a detection validation split.

mAP comes from the COCO protocol (:mod:`.metrics`); these are the complementary figures a
training run reports: every prediction matched greedily (highest confidence first) to an unmatched
ground truth of its class at IoU >= 0.5, the per-class precision/recall curves over confidence,
precision and recall at the confidence that maximises the mean F1 over classes, and a confusion
matrix at a fixed confidence (background as the last row/column).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, m) IoU of xyxy boxes, float64: torchvision's ``box_iou`` formula operation for
    operation (the same values, bit for bit: a test compares them). Written in numpy because
    the evaluation's child processes (:mod:`.evalpool`) run this module without torch, whose
    import costs seconds per process."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = np.maximum(a[:, None, :2], b[:, :2])
    rb = np.minimum(a[:, None, 2:], b[:, 2:])
    wh = np.clip(rb - lt, 0.0, None)
    inter = wh[:, :, 0] * wh[:, :, 1]
    return inter / (area_a[:, None] + area_b - inter)


def _match(pred: np.ndarray, gt: np.ndarray, iou_thr: float) -> np.ndarray:
    """True positives of ``pred`` (n, 6) sorted by confidence against ``gt`` (m, 5), same class."""
    tp = np.zeros(len(pred), dtype=bool)
    if not len(pred) or not len(gt):
        return tp
    iou = box_iou(pred[:, :4], gt[:, 1:5])
    same = pred[:, 5:6].astype(np.int64) == gt[None, :, 0].astype(np.int64)
    iou = np.where(same, iou, 0.0)
    taken = np.zeros(len(gt), dtype=bool)
    order = np.argsort(-pred[:, 4], kind="stable")
    # only predictions reaching some ground truth can match: a weak detector's max_det rows per
    # image are mostly not, and the greedy loop is Python
    for i in order[(iou[order] >= iou_thr).any(1)]:
        cand = np.where(~taken & (iou[i] >= iou_thr))[0]
        if len(cand):
            j = cand[np.argmax(iou[i, cand])]
            taken[j] = tp[i] = True
    return tp


@dataclass
class PRSummary:
    """Per-class curves on a confidence grid and the operating point of the best mean F1."""

    conf_grid: np.ndarray        # (G,)
    precision: np.ndarray        # (nc, G): precision of detections with conf >= grid value
    recall: np.ndarray           # (nc, G)
    present: np.ndarray          # (nc,) bool: classes with ground truth
    best_conf: float
    p: float                     # mean precision over present classes at best_conf
    r: float                     # mean recall over present classes at best_conf


def pr_rows(preds: list[np.ndarray], gts: list[np.ndarray], nc: int, classes=None, iou_thr: float = 0.5,
            grid: int = 101) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class precision and recall on the confidence grid, (k, G) each, and the ground-truth
    instances (k,), for ``classes`` (ascending; default all ``nc``). A class's rows depend on
    its own predictions and ground truths only (a prediction matches a ground truth of its
    class), so rows computed for a subset equal the same rows of the whole."""
    sub = None if classes is None else np.asarray(classes, dtype=np.int64)
    ks = np.arange(nc) if sub is None else sub
    confs, tps, labels = [], [], []
    n_gt = np.zeros(nc, dtype=np.int64)
    for pred, gt in zip(preds, gts):
        pred = np.asarray(pred, dtype=np.float64).reshape(-1, 6)
        gt = np.asarray(gt, dtype=np.float64).reshape(-1, 5)
        if sub is not None:
            pred = pred[np.isin(pred[:, 5].astype(np.int64), sub)]
            gt = gt[np.isin(gt[:, 0].astype(np.int64), sub)]
        for c in gt[:, 0].astype(np.int64):
            if 0 <= c < nc:
                n_gt[c] += 1
        confs.append(pred[:, 4])
        tps.append(_match(pred, gt, iou_thr))
        labels.append(pred[:, 5].astype(np.int64))
    conf = np.concatenate(confs) if confs else np.zeros(0)
    tp = np.concatenate(tps) if tps else np.zeros(0, dtype=bool)
    cls = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    g = np.linspace(0, 1, grid)
    precision = np.zeros((len(ks), grid))
    recall = np.zeros((len(ks), grid))
    for row, c in enumerate(ks):
        sel = cls == c
        above = conf[sel][None, :] >= g[:, None]              # (G, n_c)
        n_det = above.sum(1)
        n_tp = (above & tp[sel][None, :]).sum(1)
        precision[row] = np.where(n_det > 0, n_tp / np.maximum(n_det, 1), 1.0)
        recall[row] = n_tp / max(int(n_gt[c]), 1)
    return precision, recall, n_gt[ks]


def summarize_pr(precision: np.ndarray, recall: np.ndarray, n_gt: np.ndarray, grid: int = 101) -> PRSummary:
    """:class:`PRSummary` of every class's rows (:func:`pr_rows`, in class order)."""
    g = np.linspace(0, 1, grid)
    present = np.asarray(n_gt) > 0
    if not present.any():
        return PRSummary(g, precision, recall, present, 0.0, 0.0, 0.0)
    p_mean, r_mean = precision[present].mean(0), recall[present].mean(0)
    f1 = 2 * p_mean * r_mean / np.maximum(p_mean + r_mean, 1e-12)
    best = int(np.argmax(f1))
    if f1[best] <= 0:
        # no correct detection at any confidence: a class without detections has precision 1 on
        # the curves (nothing claimed, nothing wrong), but an epoch that found nothing reports P 0
        return PRSummary(g, precision, recall, present, 0.0, 0.0, 0.0)
    return PRSummary(g, precision, recall, present, float(g[best]), float(p_mean[best]), float(r_mean[best]))


def pr_summary(preds: list[np.ndarray], gts: list[np.ndarray], nc: int, iou_thr: float = 0.5,
               grid: int = 101) -> PRSummary:
    """Precision and recall per class as functions of the confidence threshold."""
    return summarize_pr(*pr_rows(preds, gts, nc, iou_thr=iou_thr, grid=grid), grid=grid)


def confusion_matrix(preds: list[np.ndarray], gts: list[np.ndarray], nc: int, conf: float = 0.25,
                     iou_thr: float = 0.45) -> np.ndarray:
    """(nc + 1, nc + 1) counts, rows = predicted class, columns = true class; index nc is the
    background (a prediction matching no ground truth, a ground truth no prediction found)."""
    m = np.zeros((nc + 1, nc + 1), dtype=np.int64)
    for pred, gt in zip(preds, gts):
        pred = np.asarray(pred, dtype=np.float64).reshape(-1, 6)
        gt = np.asarray(gt, dtype=np.float64).reshape(-1, 5)
        pred = pred[pred[:, 4] >= conf]
        gt_cls = gt[:, 0].astype(np.int64)
        if not len(pred):
            for c in gt_cls:
                m[nc, c] += 1
            continue
        pred_cls = pred[:, 5].astype(np.int64)
        if not len(gt):
            for c in pred_cls:
                m[c, nc] += 1
            continue
        iou = box_iou(pred[:, :4], gt[:, 1:5])
        used_p, used_g = set(), set()
        for flat in np.argsort(-iou, axis=None, kind="stable"):   # best overlaps first, any class
            i, j = divmod(int(flat), len(gt))
            if iou[i, j] < iou_thr:
                break
            if i in used_p or j in used_g:
                continue
            used_p.add(i)
            used_g.add(j)
            m[pred_cls[i], gt_cls[j]] += 1
        for i in set(range(len(pred))) - used_p:
            m[pred_cls[i], nc] += 1
        for j in set(range(len(gt))) - used_g:
            m[nc, gt_cls[j]] += 1
    return m
