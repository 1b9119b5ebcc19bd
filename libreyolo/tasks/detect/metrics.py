"""Detection mAP (COCO protocol) from in-memory predictions and ground truths.

The numbers come from faster-coco-eval (a fast drop-in for pycocotools), or from pycocotools
when faster-coco-eval is not installed, so they are the standard COCO mAP50 and mAP50-95:
101-point interpolated precision, IoU thresholds 0.50:0.05:0.95, all areas, 100 detections per
image. Everything is built from dicts in memory; nothing is written to disk or printed.
"""
from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

import numpy as np

INSTALL_HINT = "mAP needs faster-coco-eval (or pycocotools): pip install faster-coco-eval"


def _silent(*args: Any, **kwargs: Any) -> None:
    return None


def as_array(x: Any, cols: int) -> np.ndarray:
    """Tensor / array / list -> float64 (n, cols) array (an empty input gives (0, cols))."""
    # torch only if already imported (a tensor implies it): the evaluation's child processes
    # run this module without it
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return np.zeros((0, cols), dtype=np.float64)
    a = a.reshape(-1, a.shape[-1])
    if a.shape[1] < cols:
        raise ValueError(f"expected rows of at least {cols} values, got shape {a.shape}")
    return a[:, :cols]


def coco_backend():
    """(COCO, COCOeval class, quiet kwargs) from faster-coco-eval, else pycocotools."""
    try:
        from faster_coco_eval import COCO, COCOeval_faster
        return COCO, COCOeval_faster, {"print_function": _silent}
    except ImportError:
        pass
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
        return COCO, COCOeval, {}
    except ImportError:
        raise ImportError(INSTALL_HINT) from None


def _coco_precision(gt: dict, dets: list[dict]) -> np.ndarray:
    """COCOeval precision array (T, R, K, A, M) for a GT dict and a detections list."""
    COCO, COCOeval, quiet = coco_backend()
    with contextlib.redirect_stdout(io.StringIO()):   # pycocotools prints progress
        if quiet:
            coco_gt = COCO(gt, **quiet)
            coco_dt = coco_gt.loadRes(dets)
            ev = COCOeval(coco_gt, coco_dt, iouType="bbox", **quiet)
        else:
            coco_gt = COCO()
            coco_gt.dataset = gt
            coco_gt.createIndex()
            coco_dt = coco_gt.loadRes(dets)
            ev = COCOeval(coco_gt, coco_dt, iouType="bbox")
        ev.evaluate()
        ev.accumulate()
    return np.asarray(ev.eval["precision"])


def _xywh_in_range(rows: np.ndarray, cls_col: int, box_col: int, nc: int):
    """The rows whose class (column ``cls_col``, truncated to an int) is in ``0..nc-1``: (those
    rows, their classes, x1, y1, width, height) with the xyxy box at ``box_col`` and negative
    sides clipped to 0."""
    c = rows[:, cls_col].astype(np.int64)
    keep = (c >= 0) & (c < nc)
    rows, c = rows[keep], c[keep]
    x1, y1 = rows[:, box_col], rows[:, box_col + 1]
    return rows, c, x1, y1, np.maximum(rows[:, box_col + 2] - x1, 0.0), np.maximum(rows[:, box_col + 3] - y1, 0.0)


def coco_inputs(predictions: list, ground_truths: list, nc: int) -> tuple[list, list, list, np.ndarray]:
    """The COCO ``images``, ground-truth ``annotations`` and detection results of
    :func:`evaluate_detections` (image ids from 1, annotation ids in order from 1, category id =
    class + 1, xywh boxes with negative sides clipped to 0; rows whose class is outside
    ``0..nc-1`` left out), and the ground-truth instances per class.

    Built column-wise with numpy and handed over as Python floats (the same float64 values a
    row-by-row loop gives): a validation split of a weak detector carries up to ``max_det``
    detections per image, and a Python loop over numpy rows cost more than the COCO evaluation."""
    images, anns, dets = [], [], []
    instances = np.zeros(nc, dtype=np.int64)
    for i, (pred, gt) in enumerate(zip(predictions, ground_truths), start=1):
        images.append({"id": i, "width": 1, "height": 1})
        _, c, x1, y1, w, h = _xywh_in_range(as_array(gt, 5), 0, 1, nc)
        instances += np.bincount(c, minlength=nc)
        first = len(anns) + 1
        anns.extend({"id": first + k, "image_id": i, "category_id": ck + 1, "bbox": [a, b, ww, hh],
                     "area": area, "iscrowd": 0}
                    for k, (ck, a, b, ww, hh, area) in enumerate(zip(
                        c.tolist(), x1.tolist(), y1.tolist(), w.tolist(), h.tolist(), (w * h).tolist())))
        d, c, x1, y1, w, h = _xywh_in_range(as_array(pred, 6), 5, 0, nc)
        dets.extend({"image_id": i, "category_id": ck + 1, "score": sc, "bbox": [a, b, ww, hh]}
                    for ck, sc, a, b, ww, hh in zip(
                        c.tolist(), d[:, 4].tolist(), x1.tolist(), y1.tolist(), w.tolist(), h.tolist()))
    return images, anns, dets, instances


def coco_ap(predictions: list, ground_truths: list, nc: int, classes=None) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The ground-truth instances per class (nc,) and, for each scored class of ``classes``
    (ascending; default all ``nc``) - one with ground truth -, its COCO AP at each IoU threshold
    (T,). COCO scores each (image, class) pair on its own, so the APs of a subset evaluated
    alone equal the same classes' APs of the whole split (what :mod:`.evalpool` relies on)."""
    cats = list(range(nc)) if classes is None else sorted(set(int(c) for c in classes))
    if classes is not None:
        predictions = [a[np.isin(a[:, 5].astype(np.int64), cats)] for a in (as_array(p, 6) for p in predictions)]
        ground_truths = [a[np.isin(a[:, 0].astype(np.int64), cats)] for a in (as_array(g, 5) for g in ground_truths)]
    images, anns, dets, instances = coco_inputs(predictions, ground_truths, nc)
    scored = [c for c in cats if instances[c] > 0]
    if not scored or not dets:   # nothing detected: every scored class has AP 0 (and loadRes([]) can fail)
        return instances, {c: np.zeros(10) for c in scored}
    gt_dict = {"images": images, "annotations": anns, "categories": [{"id": c + 1, "name": str(c)} for c in cats]}
    precision = _coco_precision(gt_dict, dets)           # (T, R, K, A, M); K follows category ids
    p = precision[:, :, :, 0, -1]                        # area "all", maxDets 100 -> (T, R, K)
    column = {c: k for k, c in enumerate(cats)}
    return instances, {c: np.array([row[row > -1].mean() if (row > -1).any() else 0.0 for row in p[:, :, column[c]]])
                       for c in scored}


def summarize_ap(instances: np.ndarray, ap: dict[int, np.ndarray], nc: int, names: dict[int, str] | None = None) -> dict:
    """:func:`evaluate_detections`' result from every class's :func:`coco_ap`."""
    names = names or {}
    label = {c: str(names.get(c, c)) for c in range(nc)}
    present = [c for c in range(nc) if instances[c] > 0]
    per_class = {label[c]: {"map50": float(ap[c][0]), "map50_95": float(ap[c].mean()), "instances": int(instances[c])}
                 for c in present}
    if not present:
        return {"map50": 0.0, "map50_95": 0.0, "per_class": per_class}
    return {"map50": float(np.mean([ap[c][0] for c in present])),
            "map50_95": float(np.mean([ap[c].mean() for c in present])), "per_class": per_class}


def evaluate_detections(predictions: list, ground_truths: list, nc: int,
                        names: dict[int, str] | None = None) -> dict:
    """COCO mAP50 and mAP50-95, overall and per class.

    ``predictions[i]``: (n, 6) ``[x1, y1, x2, y2, conf, cls]`` for image i; ``ground_truths[i]``:
    (m, 5) ``[cls, x1, y1, x2, y2]``; both in pixels, tensors or arrays. Returns
    ``{"map50", "map50_95", "per_class": {name: {"map50", "map50_95", "instances"}}}``. As in COCO,
    only classes with at least one ground-truth instance are scored (the overall figures are
    their mean); with no ground truth at all both figures are 0.0 and ``per_class`` is empty.
    Raises ImportError (saying ``pip install faster-coco-eval``) if no COCO backend is installed.
    """
    if len(predictions) != len(ground_truths):
        raise ValueError(f"{len(predictions)} prediction lists for {len(ground_truths)} images")
    coco_backend()   # fail early and clearly when no backend is installed
    return summarize_ap(*coco_ap(predictions, ground_truths, nc), nc, names)
