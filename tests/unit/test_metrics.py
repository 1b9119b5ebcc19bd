"""COCO mAP wrapper: known answers on hand-made cases, empty inputs, backend fallback."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("faster_coco_eval")

from libreyolo.tasks.detect.metrics import evaluate_detections  # noqa: E402

GT = [torch.tensor([[0, 10, 10, 50, 60], [1, 60, 20, 90, 90]], dtype=torch.float32),
      torch.tensor([[2, 5, 5, 95, 40]], dtype=torch.float32)]


def _perfect(gts):
    return [torch.cat((g[:, 1:5], torch.full((len(g), 1), 0.9), g[:, :1]), 1) for g in gts]


def test_perfect_predictions():
    r = evaluate_detections(_perfect(GT), GT, nc=3, names={0: "a", 1: "b", 2: "c"})
    assert r["map50"] == pytest.approx(1.0)
    assert r["map50_95"] == pytest.approx(1.0)
    assert set(r["per_class"]) == {"a", "b", "c"}
    assert r["per_class"]["a"] == {"map50": pytest.approx(1.0), "map50_95": pytest.approx(1.0),
                                   "instances": 1}


def test_iou_about_0_6_passes_only_two_thresholds():
    # gt 10x10; prediction 5.9x10 inside it: IoU 0.59 -> matched at 0.50 and 0.55 only: 2/10.
    gt = [np.array([[0, 0, 0, 10, 10]], dtype=np.float64)]
    pred = [np.array([[0, 0, 5.9, 10, 0.8, 0]], dtype=np.float64)]
    r = evaluate_detections(pred, gt, nc=1)
    assert r["map50"] == pytest.approx(1.0)
    assert r["map50_95"] == pytest.approx(0.2)
    assert r["per_class"]["0"]["map50_95"] == pytest.approx(0.2)


def test_wrong_class_scores_zero():
    gt = [torch.tensor([[0, 0, 0, 10, 10]])]
    pred = [torch.tensor([[0, 0, 10, 10, 0.9, 1]])]
    r = evaluate_detections(pred, gt, nc=2)
    assert r["map50"] == 0.0 and r["map50_95"] == 0.0
    assert set(r["per_class"]) == {"0"}          # class 1 has no instances: not scored


def test_mixed_classes_average():
    # class 0 found perfectly, class 1 missed: mean over the two scored classes.
    gt = [torch.tensor([[0, 0, 0, 10, 10], [1, 20, 20, 40, 40]])]
    pred = [torch.tensor([[0, 0, 10, 10, 0.9, 0]])]
    r = evaluate_detections(pred, gt, nc=2)
    assert r["map50"] == pytest.approx(0.5)
    assert r["per_class"]["1"]["map50"] == 0.0 and r["per_class"]["1"]["instances"] == 1


def test_empty_inputs():
    empty_pred, empty_gt = torch.zeros(0, 6), torch.zeros(0, 5)
    r = evaluate_detections([empty_pred], [empty_gt], nc=3)
    assert r == {"map50": 0.0, "map50_95": 0.0, "per_class": {}}
    r = evaluate_detections([], [], nc=3)
    assert r["map50"] == 0.0 and r["per_class"] == {}
    r = evaluate_detections([empty_pred, empty_pred], GT, nc=3)     # nothing detected
    assert r["map50"] == 0.0 and r["per_class"]["2"]["instances"] == 1
    r = evaluate_detections([torch.tensor([[0, 0, 5, 5, 0.5, 0]]), empty_pred],
                            [empty_gt, empty_gt], nc=3)              # detections, no ground truth
    assert r["map50"] == 0.0 and r["per_class"] == {}
    # one image with objects and a correct detection, one empty image with a false positive
    r = evaluate_detections([_perfect(GT[:1])[0], torch.tensor([[0, 0, 5, 5, 0.1, 0]])],
                            [GT[0], empty_gt], nc=3)
    assert r["map50"] == pytest.approx(1.0)


def test_pycocotools_fallback_and_missing_backend(monkeypatch):
    import faster_coco_eval
    from faster_coco_eval import coco, cocoeval

    # Fallback: faster_coco_eval unimportable, pycocotools present (faster-coco-eval's shim).
    monkeypatch.setitem(sys.modules, "pycocotools", faster_coco_eval)
    monkeypatch.setitem(sys.modules, "pycocotools.coco", coco)
    monkeypatch.setitem(sys.modules, "pycocotools.cocoeval", cocoeval)
    monkeypatch.setitem(sys.modules, "faster_coco_eval", None)
    r = evaluate_detections(_perfect(GT), GT, nc=3)
    assert r["map50_95"] == pytest.approx(1.0)

    monkeypatch.setitem(sys.modules, "pycocotools", None)
    monkeypatch.setitem(sys.modules, "pycocotools.coco", None)
    with pytest.raises(ImportError, match="pip install faster-coco-eval"):
        evaluate_detections(_perfect(GT), GT, nc=3)


def test_coco_inputs_are_those_of_a_row_by_row_loop():
    """The column-wise COCO inputs equal, value for value, a plain loop over the rows (ids, class
    filter, clipped xywh, areas, scores), for arrays and tensors, with classes out of range and
    boxes of negative width among them."""
    from libreyolo.tasks.detect.metrics import coco_inputs
    rng = np.random.default_rng(0)
    nc = 4
    preds, gts = [], []
    for n, m in [(7, 3), (0, 2), (5, 0), (12, 6)]:
        p = np.concatenate([rng.uniform(0, 50, (n, 4)), rng.uniform(0, 1, (n, 1)),
                            rng.integers(-1, nc + 1, (n, 1))], 1).astype(np.float32)
        g = np.concatenate([rng.integers(-1, nc + 1, (m, 1)), rng.uniform(0, 50, (m, 4))], 1).astype(np.float32)
        preds.append(torch.from_numpy(p) if n % 2 else p)
        gts.append(g)
    images, anns, dets = [], [], []
    instances = np.zeros(nc, dtype=np.int64)
    for i, (pred, gt) in enumerate(zip(preds, gts), start=1):
        images.append({"id": i, "width": 1, "height": 1})
        for cls, x1, y1, x2, y2 in np.asarray(gt, dtype=np.float64).reshape(-1, 5):
            c = int(cls)
            if 0 <= c < nc:
                w, h = max(x2 - x1, 0.0), max(y2 - y1, 0.0)
                instances[c] += 1
                anns.append({"id": len(anns) + 1, "image_id": i, "category_id": c + 1,
                             "bbox": [x1, y1, w, h], "area": w * h, "iscrowd": 0})
        for x1, y1, x2, y2, conf, cls in np.asarray(pred, dtype=np.float64).reshape(-1, 6):
            c = int(cls)
            if 0 <= c < nc:
                dets.append({"image_id": i, "category_id": c + 1, "score": float(conf),
                             "bbox": [x1, y1, max(x2 - x1, 0.0), max(y2 - y1, 0.0)]})
    got = coco_inputs(preds, gts, nc)
    assert got[0] == images and got[1] == anns and got[2] == dets and got[3].tolist() == instances.tolist()
    assert anns and dets and any(d["bbox"][2] == 0.0 for d in dets)   # the cases are exercised
