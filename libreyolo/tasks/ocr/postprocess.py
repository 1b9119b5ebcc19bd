"""Host side of OCR: DB boxes from the shrink map, reading order, text-line crops, rec batches.

DB post-process (Differentiable Binarization, as PP-OCR's detector is used): the stage's binary
map (``prob > det_thresh``) is traced into contours by OpenCV (``cv2.findContours``, every
contour, simple chain); each contour's minimum-area rectangle is kept when its short side is
at least :data:`MIN_SIZE` pixels and the mean probability inside it reaches ``box_thresh``; the
rectangle is then grown back ("unclipped") by the Vatti offset (``pyclipper``, round joins) of
``area * unclip_ratio / perimeter`` - the shrink the detector was trained to predict - and
replaced by the minimum-area rectangle of the grown polygon (short side at least
``MIN_SIZE + 2``). Corners go back to original-image pixels by the letterbox scale.

The contours are data-dependent in number and shape, so this runs on the host, on the
detector's outputs copied there in one transfer; everything before (network, sigmoid map,
threshold) is inside the captured stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: a box whose short side is below this many pixels (in the detector's input) is noise
MIN_SIZE = 3
#: PP-OCR's recognition input height
REC_HEIGHT = 48
#: recognition crop widths a crop is padded to (the smallest that holds it; PP-OCR pads to at
#: least 320); wider crops are squeezed to the last. Each is one captured recognition stage.
REC_BUCKETS = (320, 640, 960, 1280)


def _cv2():
    try:
        import cv2
    except ImportError as exc:  # the `ocr` extra
        raise ImportError("OCR needs OpenCV and pyclipper: pip install 'libreyolo[ocr]'") from exc
    return cv2


def _pyclipper():
    try:
        import pyclipper
    except ImportError as exc:
        raise ImportError("OCR needs OpenCV and pyclipper: pip install 'libreyolo[ocr]'") from exc
    return pyclipper


def order_quad(points: np.ndarray) -> np.ndarray:
    """Four corners -> top-left, top-right, bottom-right, bottom-left (by x, then y per side)."""
    pts = points[np.argsort(points[:, 0], kind="stable")]
    left, right = pts[:2], pts[2:]
    tl, bl = left[np.argsort(left[:, 1], kind="stable")]
    tr, br = right[np.argsort(right[:, 1], kind="stable")]
    return np.stack([tl, tr, br, bl]).astype(np.float32)


def _min_rect(points: np.ndarray) -> tuple[np.ndarray, float]:
    """Ordered corners of the minimum-area rectangle of ``points`` and its short side."""
    cv2 = _cv2()
    rect = cv2.minAreaRect(points.reshape(-1, 1, 2).astype(np.float32))
    return order_quad(cv2.boxPoints(rect)), float(min(rect[1]))


def box_score(prob: np.ndarray, quad: np.ndarray) -> float:
    """Mean of ``prob`` over the pixels inside ``quad`` (its bounding box, masked by the quad)."""
    cv2 = _cv2()
    h, w = prob.shape
    x0 = int(np.clip(np.floor(quad[:, 0].min()), 0, w - 1))
    x1 = int(np.clip(np.ceil(quad[:, 0].max()), 0, w - 1))
    y0 = int(np.clip(np.floor(quad[:, 1].min()), 0, h - 1))
    y1 = int(np.clip(np.ceil(quad[:, 1].max()), 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    cv2.fillPoly(mask, [np.round(quad - [x0, y0]).astype(np.int32).reshape(-1, 1, 2)], 1)
    return float(cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0])


def unclip(quad: np.ndarray, ratio: float) -> np.ndarray | None:
    """The quad grown by ``area * ratio / perimeter`` (pyclipper, round joins); None if it vanishes."""
    cv2, pyclipper = _cv2(), _pyclipper()
    area = abs(float(cv2.contourArea(quad)))
    length = float(cv2.arcLength(quad.reshape(-1, 1, 2), True))
    if length <= 0:
        return None
    off = pyclipper.PyclipperOffset()
    off.AddPath([tuple(p) for p in quad.tolist()], pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    grown = off.Execute(area * ratio / length)
    if len(grown) != 1:   # PP-OCR keeps single-polygon expansions only
        return None
    return np.asarray(grown[0], dtype=np.float32)


@dataclass
class DBBoxes:
    """Quads (n, 4, 2) float32 in original-image pixels and their box scores (n,)."""

    quads: np.ndarray
    scores: np.ndarray


def db_boxes(bitmap: np.ndarray, prob: np.ndarray, orig_hw: tuple[int, int], box_thresh: float,
             unclip_ratio: float, max_lines: int) -> DBBoxes:
    """DB post-process of one image (see the module docstring). ``bitmap`` / ``prob``: the part
    of the detector's maps that the letterboxed image covers; at most ``max_lines`` boxes are
    kept (contours in OpenCV's order)."""
    cv2 = _cv2()
    mh, mw = bitmap.shape
    oh, ow = orig_hw
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    quads, scores = [], []
    for contour in contours:
        if len(quads) >= max_lines:
            break
        quad, short = _min_rect(contour.reshape(-1, 2))
        if short < MIN_SIZE:
            continue
        score = box_score(prob, quad)
        if score < box_thresh:
            continue
        grown = unclip(quad, unclip_ratio)
        if grown is None:
            continue
        quad, short = _min_rect(grown)
        if short < MIN_SIZE + 2:
            continue
        quad[:, 0] = np.clip(np.round(quad[:, 0] * ow / mw), 0, ow)
        quad[:, 1] = np.clip(np.round(quad[:, 1] * oh / mh), 0, oh)
        quads.append(quad)
        scores.append(score)
    if not quads:
        return DBBoxes(np.zeros((0, 4, 2), np.float32), np.zeros((0,), np.float32))
    return DBBoxes(np.stack(quads).astype(np.float32), np.asarray(scores, np.float32))


def reading_order(quads: np.ndarray, line_tol: float = 10.0) -> np.ndarray:
    """Indices sorting quads top to bottom, then left to right within a line: by the top-left
    corner's (y, x), then neighbours whose tops are within ``line_tol`` pixels swap into x order
    (PP-OCR's ordering rule)."""
    n = len(quads)
    order = sorted(range(n), key=lambda i: (float(quads[i, 0, 1]), float(quads[i, 0, 0])))
    for i in range(n - 1):
        for j in range(i, -1, -1):
            a, b = order[j], order[j + 1]
            if abs(float(quads[b, 0, 1] - quads[a, 0, 1])) < line_tol and quads[b, 0, 0] < quads[a, 0, 0]:
                order[j], order[j + 1] = b, a
            else:
                break
    return np.asarray(order, dtype=np.int64)


def crop_line(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The text line inside ``quad`` warped upright (perspective, bicubic, replicated border);
    a crop at least 1.5x taller than wide is turned 90 degrees (vertical text read sideways)."""
    cv2 = _cv2()
    w = max(1, int(max(np.linalg.norm(quad[0] - quad[1]), np.linalg.norm(quad[2] - quad[3]))))
    h = max(1, int(max(np.linalg.norm(quad[0] - quad[3]), np.linalg.norm(quad[1] - quad[2]))))
    dst = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    m = cv2.getPerspectiveTransform(quad.astype(np.float32), dst)
    crop = cv2.warpPerspective(image, m, (w, h), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if crop.shape[0] >= 1.5 * crop.shape[1]:
        crop = np.ascontiguousarray(np.rot90(crop))
    return crop


def rec_width(crop_hw: tuple[int, int], buckets: tuple[int, ...] = REC_BUCKETS) -> int:
    """The width a crop is resized to at height 48 (aspect kept, at most the largest bucket)."""
    h, w = crop_hw
    return max(1, min(buckets[-1], int(math.ceil(REC_HEIGHT * w / max(1, h)))))


def bucket_of(width: int, buckets: tuple[int, ...] = REC_BUCKETS) -> int:
    """The smallest bucket width that holds ``width``."""
    return next(b for b in buckets if width <= b)


def resize_line(crop: np.ndarray, buckets: tuple[int, ...] = REC_BUCKETS) -> np.ndarray:
    """A crop resized (bilinear) to height 48 and its :func:`rec_width`."""
    cv2 = _cv2()
    return cv2.resize(crop, (rec_width(crop.shape[:2], buckets), REC_HEIGHT), interpolation=cv2.INTER_LINEAR)


def rec_batches(lines: list[np.ndarray], batch: int,
                buckets: tuple[int, ...] = REC_BUCKETS) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """Group resized lines by bucket width into fixed-size batches: ``(indices, uint8 (batch, 48,
    bucket, 3) zero-padded, int32 (batch,) widths)``; unused rows have width 0. One batch shape
    per bucket keeps one captured stage per bucket, and a line's result independent of the
    other lines of its image."""
    groups: dict[int, list[int]] = {}
    for i, line in enumerate(lines):
        groups.setdefault(bucket_of(line.shape[1], buckets), []).append(i)
    out = []
    for bucket in sorted(groups):
        idx = groups[bucket]
        for s in range(0, len(idx), batch):
            part = idx[s:s + batch]
            u8 = np.zeros((batch, REC_HEIGHT, bucket, 3), dtype=np.uint8)
            widths = np.zeros((batch,), dtype=np.int32)
            for r, i in enumerate(part):
                w = lines[i].shape[1]
                u8[r, :, :w] = lines[i]
                widths[r] = w
            out.append((part, u8, widths))
    return out
