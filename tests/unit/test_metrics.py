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
