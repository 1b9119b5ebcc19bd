"""Mask mAP (COCO protocol, ``iouType="segm"``) through faster-coco-eval's mask API."""
from __future__ import annotations

import contextlib
import io

import numpy as np

from ..detect.metrics import coco_backend


def encode_masks(masks: np.ndarray) -> list[dict]:
    """(n, h, w) bool bitmaps -> COCO RLEs (``counts`` as text), through faster-coco-eval."""
    from faster_coco_eval.core import mask as mask_api
    if len(masks) == 0:
        return []
    rles = mask_api.encode(np.asfortranarray(np.transpose(masks, (1, 2, 0)).astype(np.uint8)))
    for r in rles:
        if isinstance(r["counts"], bytes):
            r["counts"] = r["counts"].decode("ascii")
    return rles


def evaluate_masks(preds: list[tuple[np.ndarray, list[dict]]], gts: list[tuple[np.ndarray, list[dict]]],
                   nc: int, hw: tuple[int, int]) -> dict[str, float]:
    """COCO mask mAP50 and mAP50-95 over the classes with ground truth.

    ``preds[i]``: ((n, 2) [conf, cls], n RLEs) of image i; ``gts[i]``: ((m,) classes, m RLEs); all
    bitmaps of size ``hw``. With no ground truth both figures are 0.0."""
    from faster_coco_eval.core import mask as mask_api
    images, anns, dets = [], [], []
    present = set()
    for i, ((gcls, grle), (prow, prle)) in enumerate(zip(gts, preds), start=1):
        images.append({"id": i, "height": int(hw[0]), "width": int(hw[1])})
        for c, r in zip(np.asarray(gcls).tolist(), grle):
            x, y, w, h = mask_api.toBbox(r).tolist()
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(c) + 1, "segmentation": r,
                         "area": float(mask_api.area(r)), "bbox": [x, y, w, h], "iscrowd": 0})
            present.add(int(c))
        for (score, c), r in zip(np.asarray(prow).reshape(-1, 2).tolist(), prle):
            dets.append({"image_id": i, "category_id": int(c) + 1, "segmentation": r, "score": float(score)})
    if not present or not dets:
        return {"mask_map50": 0.0, "mask_map50_95": 0.0}
    COCO, COCOeval, quiet = coco_backend()
    gt = {"images": images, "annotations": anns, "categories": [{"id": c + 1, "name": str(c)} for c in range(nc)]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(gt, **quiet)
        ev = COCOeval(coco_gt, coco_gt.loadRes(dets), iouType="segm", **quiet)
        ev.evaluate()
        ev.accumulate()
    p = np.asarray(ev.eval["precision"])[:, :, :, 0, -1]          # (T, R, K) area all, 100 dets
    ap = []
    for c in sorted(present):
        rows = p[:, :, c]
        ap.append([row[row > -1].mean() if (row > -1).any() else 0.0 for row in rows])
    ap = np.asarray(ap)                                              # (classes, T)
    return {"mask_map50": float(ap[:, 0].mean()), "mask_map50_95": float(ap.mean())}
