"""Rotated-box mAP50 / mAP50-95 with exact polygon IoUs.

faster-coco-eval (like pycocotools) computes its IoUs itself from axis-aligned boxes, masks or
keypoints, and its matching and accumulation cannot be fed outside IoUs, so COCO's protocol is
written out here over :func:`~.rotated.polygon_iou`: per image and class, detections in score
order each take the best still-unmatched ground truth whose IoU reaches the threshold (10
thresholds 0.50:0.05:0.95); per class, precision is made monotone and read at 101 recall points;
the mAP is the mean over the classes that have ground truth. No area ranges, at most ``max_det``
detections per image, no crowd regions (OBB labels have none). For upright boxes it gives
faster-coco-eval's bbox mAP (``tests/unit/test_obb.py``).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .rotated import polygon_iou

THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALLS = np.linspace(0.0, 1.0, 101)


def _ap(tp: np.ndarray, scores: np.ndarray, n_gt: int) -> np.ndarray:
    """COCO's 101-point AP per threshold: ``tp`` (T, D) matched flags of detections, ``scores`` (D,)."""
    order = np.argsort(-scores, kind="mergesort")
    tp = tp[:, order].astype(np.float64)
    ctp, cfp = np.cumsum(tp, 1), np.cumsum(1 - tp, 1)
    out = np.zeros(len(tp))
    for t in range(len(tp)):
        rec = ctp[t] / n_gt
        prec = ctp[t] / np.maximum(ctp[t] + cfp[t], np.finfo(np.float64).eps)
        prec = np.maximum.accumulate(prec[::-1])[::-1] if len(prec) else prec
        idx = np.searchsorted(rec, RECALLS, side="left")
        out[t] = np.where(idx < len(prec), prec[np.minimum(idx, len(prec) - 1)], 0.0).mean()
    return out


def rotated_map(preds: Sequence[dict], gts: Sequence[dict], max_det: int = 300) -> dict[str, float]:
    """``{"map50", "map50_95"}`` of per-image rotated predictions against ground truth.

    ``preds[i]``: ``xywhr`` (n, 5), ``scores`` (n,), ``cls`` (n,); ``gts[i]``: ``xywhr`` (m, 5),
    ``cls`` (m,); one coordinate frame per image (pixels), angles in radians. A split without
    ground truth scores NaN.
    """
    classes = sorted({int(c) for g in gts for c in np.asarray(g["cls"]).reshape(-1)})
    if not classes:
        return {"map50": float("nan"), "map50_95": float("nan")}
    per_class = {c: ([], [], 0) for c in classes}        # flags (T, d) per image, scores, gt count
    for p, g in zip(preds, gts):
        pb = np.asarray(p["xywhr"], np.float64).reshape(-1, 5)
        ps = np.asarray(p["scores"], np.float64).reshape(-1)
        pc = np.asarray(p["cls"]).reshape(-1).astype(np.int64)
        top = np.argsort(-ps, kind="mergesort")[:max_det]
        pb, ps, pc = pb[top], ps[top], pc[top]
        gb = np.asarray(g["xywhr"], np.float64).reshape(-1, 5)
        gc = np.asarray(g["cls"]).reshape(-1).astype(np.int64)
        for c in classes:
            d, t = pc == c, gc == c
            flags_list, scores_list, n = per_class[c]
            n += int(t.sum())
            if d.any():
                iou = polygon_iou(pb[d], gb[t])                      # (d, t), detections in score order
                flags = np.zeros((len(THRESHOLDS), int(d.sum())), bool)
                for k, thr in enumerate(THRESHOLDS):
                    taken = np.zeros(iou.shape[1], bool)
                    for i in range(iou.shape[0]):
                        cand = np.where(taken, -1.0, iou[i])
                        if cand.size and cand.max() >= thr:
                            j = int(cand.argmax())
                            taken[j] = True
                            flags[k, i] = True
                flags_list.append(flags)
                scores_list.append(ps[d])
            per_class[c] = (flags_list, scores_list, n)
    aps = []
    for c in classes:
        flags_list, scores_list, n = per_class[c]
        if n == 0:
            continue
        if not flags_list:
            aps.append(np.zeros(len(THRESHOLDS)))
            continue
        aps.append(_ap(np.concatenate(flags_list, 1), np.concatenate(scores_list), n))
    ap = np.mean(aps, 0)
    return {"map50": float(ap[0]), "map50_95": float(ap.mean())}
