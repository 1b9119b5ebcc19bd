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
import torch
from torchvision.ops import box_iou


def _match(pred: np.ndarray, gt: np.ndarray, iou_thr: float) -> np.ndarray:
    """True positives of ``pred`` (n, 6) sorted by confidence against ``gt`` (m, 5), same class."""
    tp = np.zeros(len(pred), dtype=bool)
    if not len(pred) or not len(gt):
        return tp
    iou = box_iou(torch.as_tensor(pred[:, :4], dtype=torch.float64), torch.as_tensor(gt[:, 1:5], dtype=torch.float64)).numpy()
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


def pr_summary(preds: list[np.ndarray], gts: list[np.ndarray], nc: int, iou_thr: float = 0.5,
               grid: int = 101) -> PRSummary:
    """Precision and recall per class as functions of the confidence threshold."""
    confs, tps, classes = [], [], []
    n_gt = np.zeros(nc, dtype=np.int64)
    for pred, gt in zip(preds, gts):
        pred = np.asarray(pred, dtype=np.float64).reshape(-1, 6)
        gt = np.asarray(gt, dtype=np.float64).reshape(-1, 5)
        for c in gt[:, 0].astype(np.int64):
            if 0 <= c < nc:
                n_gt[c] += 1
        confs.append(pred[:, 4])
        tps.append(_match(pred, gt, iou_thr))
        classes.append(pred[:, 5].astype(np.int64))
    conf = np.concatenate(confs) if confs else np.zeros(0)
    tp = np.concatenate(tps) if tps else np.zeros(0, dtype=bool)
    cls = np.concatenate(classes) if classes else np.zeros(0, dtype=np.int64)
    g = np.linspace(0, 1, grid)
    precision = np.zeros((nc, grid))
    recall = np.zeros((nc, grid))
    for c in range(nc):
        sel = cls == c
        above = conf[sel][None, :] >= g[:, None]              # (G, n_c)
        n_det = above.sum(1)
        n_tp = (above & tp[sel][None, :]).sum(1)
        precision[c] = np.where(n_det > 0, n_tp / np.maximum(n_det, 1), 1.0)
        recall[c] = n_tp / max(int(n_gt[c]), 1)
    present = n_gt > 0
    if not present.any():
        return PRSummary(g, precision, recall, present, 0.0, 0.0, 0.0)
    p_mean, r_mean = precision[present].mean(0), recall[present].mean(0)
    f1 = 2 * p_mean * r_mean / np.maximum(p_mean + r_mean, 1e-12)
    best = int(np.argmax(f1))
    return PRSummary(g, precision, recall, present, float(g[best]), float(p_mean[best]), float(r_mean[best]))


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
        iou = box_iou(torch.as_tensor(pred[:, :4]), torch.as_tensor(gt[:, 1:5])).numpy()
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
