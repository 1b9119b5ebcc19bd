"""OKS mAP of keypoint predictions, through faster-coco-eval (``iouType="keypoints"``), and the
same detections' box mAP (``iouType="bbox"``): a pose model's boxes are its instances, so a low OKS
beside a high box mAP says the keypoints are the weak part, a low box mAP says the instances are.

Each ground-truth instance's area (the OKS scale) is its box area, as for YOLO-pose labels,
which carry no segmentation; the per-keypoint sigmas come from the dataset (COCO's by default).
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np


def _silent(*args, **kwargs) -> None:
    return None


#: what :func:`oks_map` returns: OKS mAP50 / 50-95, then the same detections' box mAP50 / 50-95
METRICS = ("oks_map50", "oks_map50_95", "map50", "map50_95")


def oks_map(preds: Sequence[dict], gts: Sequence[dict], sigmas: Sequence[float]) -> dict[str, float]:
    """``{"oks_map50", "oks_map50_95", "map50", "map50_95"}`` (OKS, then box) of per-image
    predictions against ground truth.

    ``preds[i]``: ``boxes`` (n, 4) xyxy, ``scores`` (n,), ``kpts`` (n, K, 2) in image pixels (a
    ``cls`` (n,) may be given, default 0); ``gts[i]``: ``boxes`` (m, 4) xyxy, ``kpts`` (m, K, 3)
    x, y, visibility, ``cls`` (m,). A split without any labelled keypoint scores NaN.
    """
    nan = dict.fromkeys(METRICS, float("nan"))
    from faster_coco_eval import COCO, COCOeval_faster
    k = len(sigmas)
    images, anns, dets, classes = [], [], [], set()
    for i, (p, g) in enumerate(zip(preds, gts)):
        images.append({"id": i + 1})
        gb = np.asarray(g["boxes"], np.float64).reshape(-1, 4)
        gk = np.asarray(g["kpts"], np.float64).reshape(-1, k, 3)
        gc = np.asarray(g.get("cls", np.zeros(len(gb))), np.int64).reshape(-1)
        for b, kp, c in zip(gb, gk, gc):
            w, h = b[2] - b[0], b[3] - b[1]
            vis = kp[:, 2] > 0
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c) + 1, "iscrowd": 0,
                         "bbox": [b[0], b[1], w, h], "area": float(w * h), "num_keypoints": int(vis.sum()),
                         "keypoints": np.stack([kp[:, 0], kp[:, 1], np.where(vis, 2.0, 0.0)], 1).ravel().tolist()})
            classes.add(int(c))
        pb = np.asarray(p["boxes"], np.float64).reshape(-1, 4)
        ps = np.asarray(p["scores"], np.float64).reshape(-1)
        pk = np.asarray(p["kpts"], np.float64).reshape(-1, k, 2)
        pc = np.asarray(p.get("cls", np.zeros(len(pb))), np.int64).reshape(-1)
        for b, s, kp, c in zip(pb, ps, pk, pc):
            dets.append({"image_id": i + 1, "category_id": int(c) + 1, "score": float(s),
                         "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                         "keypoints": np.concatenate([kp, np.ones((k, 1))], 1).ravel().tolist()})
            classes.add(int(c))
    if not any(a["num_keypoints"] for a in anns):
        return nan
    gt = {"images": images, "annotations": anns,
          "categories": [{"id": c + 1, "name": str(c), "keypoints": [str(j) for j in range(k)]}
                         for c in sorted(classes)]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(gt, print_function=_silent)
        if not dets:
            return dict.fromkeys(METRICS, 0.0)
        coco_dt = coco_gt.loadRes(dets)
        out = {}
        for iou_type, prefix in (("keypoints", "oks_"), ("bbox", "")):
            ev = COCOeval_faster(coco_gt, coco_dt, iouType=iou_type, print_function=_silent,
                                 **({"kpt_oks_sigmas": list(sigmas)} if iou_type == "keypoints" else {}))
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            out[prefix + "map50"] = max(0.0, float(ev.stats[1]))
            out[prefix + "map50_95"] = max(0.0, float(ev.stats[0]))
    return out
