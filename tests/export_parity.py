"""Eager-vs-ONNX comparison helpers shared by tests/unit/test_export_onnx.py and
scripts/onnx_parity.py: input-sensitive weights, test images, thresholds that give real
detections, and the order-free matching of two detection sets."""
from __future__ import annotations

import numpy as np
import torch
from fill import fill_state_dict
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.ops.letterbox import inverse_params

#: classes of the classification / segmentation models built here (detection keeps COCO's 80)
SMALL_NC = {"classify": 10, "semantic": 8}
SMALL_NC["point"] = 3
#: the tolerances of the parity claim (fp32): box corners in the network's canvas pixels, scores
BOX_TOL_PX = 1e-3
SCORE_TOL = 1e-4


def filled_model(family: str, size: str, imgsz: int):
    """An untrained model whose weights are the fixtures' deterministic fill of its own layout
    (values depend only on each tensor's name): dense detections with spread-out scores, where a
    seeded init gives near-constant ones."""
    from libreyolo.models.registry import get_family
    task = get_family(family).TASK
    m = LibreYOLO.new(family, size, nc=SMALL_NC.get(task, 80), device="cpu", imgsz=imgsz)
    layout = [[k, list(v.shape), str(v.dtype)] for k, v in m.model.state_dict().items()]
    m.load_state_dict(fill_state_dict(layout))
    return m


def parity_images() -> list[np.ndarray]:
    """The sample photo, a squashed copy of it (another aspect ratio, letterbox padding on the
    other side) and two synthetic images: noise, and flat shapes on a gradient."""
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:240, 0:320]
    shapes = np.stack([(xx * 0.8) % 256, (yy * 1.0) % 256, ((xx + yy) * 0.4) % 256], -1).astype(np.uint8)
    shapes[40:120, 50:150] = (230, 30, 30)
    shapes[(yy - 170) ** 2 + (xx - 230) ** 2 < 45 ** 2] = (20, 200, 60)
    return [np.asarray(pil), np.asarray(pil.resize((333, 517))), noise, shapes]


def pick_conf(scores: np.ndarray, target: int = 40, gap: float = 1e-5) -> float:
    """A threshold keeping about ``target`` of the (eager) detection ``scores``, half-way across a
    gap of at least ``gap`` between two consecutive ones, so that score differences between two
    runtimes cannot move a detection across it."""
    s = np.sort(np.asarray(scores, np.float64))[::-1]
    if len(s) < 2:
        raise AssertionError(f"only {len(s)} detection(s) at the lowest threshold: nothing to compare")
    order = sorted(range(len(s) - 1), key=lambda i: abs(i - (target - 1)))
    for i in order:
        if s[i] - s[i + 1] >= gap:
            return float((s[i] + s[i + 1]) / 2)
    raise AssertionError("no gap between consecutive scores to put a threshold in")


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(a[:, :2], b[:, :2]), np.minimum(a[:, 2:4], b[:, 2:4])
    inter = np.clip(rb - lt, 0, None).prod(1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def match_detections(a: np.ndarray, b: np.ndarray, shape: tuple[int, int], imgsz: int, resize: str,
                     iou: float = 0.45) -> dict:
    """One-to-one match of two (n, 6) detection sets in image pixels (same class, scores within
    SCORE_TOL, nearest boxes): the order of equal scores may differ between runtimes. Returns the
    count, the largest box difference in canvas and image pixels over the matched pairs, the
    largest score difference and ``tie_swaps``: pairs with bitwise-equal scores and boxes that
    overlap past the NMS threshold, of which greedy NMS keeps whichever comes first - each runtime
    orders equal scores its own way, so either is a correct result (they are left out of the box
    difference and counted instead)."""
    from scipy.optimize import linear_sum_assignment
    assert len(a) == len(b), f"{len(a)} eager detections vs {len(b)} ONNX"
    if len(a) == 0:
        return {"n": 0, "box_canvas": 0.0, "box_image": 0.0, "score": 0.0, "tie_swaps": 0}
    sx, sy, _, _ = inverse_params(shape[0], shape[1], imgsz, resize)
    scale = np.array([sx, sy, sx, sy])
    d = np.abs(a[:, None, :4].astype(np.float64) - b[None, :, :4])
    canvas = (d * scale).max(-1)
    bad = (a[:, None, 5] != b[None, :, 5]) | (np.abs(a[:, None, 4] - b[None, :, 4]) > SCORE_TOL)
    ri, ci = linear_sum_assignment(canvas + 1e9 * bad)
    assert not bad[ri, ci].any(), "a detection has no counterpart of the same class and score"
    far = canvas[ri, ci] > BOX_TOL_PX
    tie = far & (a[ri, 4] == b[ci, 4]) & (_iou(a[ri], b[ci]) > iou)
    keep = ~tie
    return {"n": len(a), "box_canvas": float(canvas[ri, ci][keep].max()), "box_image": float(d[ri, ci][keep].max()),
            "score": float(np.abs(a[ri, 4] - b[ci, 4]).max()), "tie_swaps": int(tie.sum())}


def compare(model, onnx_model, images, imgsz: int, **opts) -> list[dict]:
    """Eager vs ONNX predict on each image; per image the comparison's numbers (asserting them)."""
    out = []
    for img in images:
        if model.TASK == "detect":
            low = model.predict(img, imgsz=imgsz, conf=0.001, **opts)
            conf = pick_conf(low.boxes.conf.numpy())
            e = model.predict(img, imgsz=imgsz, conf=conf, **opts)
            o = onnx_model.predict(img, imgsz=imgsz, conf=conf, **opts)
            r = match_detections(e.boxes.data.numpy(), o.boxes.data.numpy(), img.shape[:2], imgsz,
                                 model.preprocess.resize)
            assert r["n"] > 0 and r["tie_swaps"] <= max(1, r["n"] // 10), r
            assert r["box_canvas"] <= BOX_TOL_PX and r["score"] <= SCORE_TOL, r
        elif model.TASK == "point":   # the same peaks: cell centres, classes and scores
            low = model.predict(img, imgsz=imgsz, conf=0.0, **opts)
            conf = pick_conf(low.points.conf.numpy())
            e, o = (m.predict(img, imgsz=imgsz, conf=conf, **opts).points.data.numpy() for m in (model, onnx_model))
            assert len(e) == len(o), (len(e), len(o))
            e, o = (a[np.lexsort((a[:, 0], a[:, 1]))] for a in (e, o))   # equal scores: either order
            r = {"n": len(e), "xy": float(np.abs(e[:, :2] - o[:, :2]).max()), "score": float(np.abs(e[:, 2] - o[:, 2]).max())}
            assert (e[:, 3] == o[:, 3]).all() and r["xy"] <= BOX_TOL_PX and r["score"] <= SCORE_TOL, r
        elif model.TASK == "classify":
            e, o = model.predict(img, imgsz=imgsz).probs, onnx_model.predict(img, imgsz=imgsz).probs
            r = {"n": len(e.top5), "score": float((e.data - o.data).abs().max()), "top5": e.top5}
            assert list(e.top5) == list(o.top5), (e.top5, o.top5)
            assert r["score"] <= SCORE_TOL, r
        else:
            e, o = model.predict(img, imgsz=imgsz).masks.data, onnx_model.predict(img, imgsz=imgsz).masks.data
            r = {"n": int(e.numel()), "classes": int(torch.unique(e).numel()), "mismatch": int((e != o).sum())}
            assert r["classes"] > 1, "a one-class map compares nothing"
            assert r["mismatch"] == 0, r
        out.append(r)
    return out
