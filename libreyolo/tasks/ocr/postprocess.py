"""Host side of OCR: DB boxes from the shrink map, reading order, text-line crops, rec batches.

DB post-process (Differentiable Binarization), PaddleOCR's ``DBPostProcess`` step for step: the
stage's binary map (``prob > det_thresh``, optionally dilated by a 2x2 kernel) is traced into
contours by OpenCV (``cv2.findContours``, every contour, simple chain); each contour's
minimum-area rectangle is kept when its short side is at least :data:`MIN_SIZE` pixels and the
mean probability inside it (box score, "fast" mode) reaches ``box_thresh``; the rectangle is then
grown back ("unclipped") by the Vatti offset (``pyclipper``, round joins) of
``area * unclip_ratio / perimeter`` - the shrink the detector was trained to predict - and
replaced by the minimum-area rectangle of the grown polygon (short side at least
``MIN_SIZE + 2``). Corners go back to original-image pixels by each axis' scale, rounded,
ordered, clipped to the image and boxes of 3 pixels or less a side dropped (the detector's
``filter_tag_det_res``). ``tests/unit/test_ocr_real.py`` checks the boxes against RapidOCR's
implementation of the same reference on the same maps.

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
#: recognition widths the graph parity protocol checks; a crop wider than the last is squeezed to it
REC_BUCKETS = (320, 640, 960, 1280)


def _cv2():
    try:
        import cv2
    except ImportError as exc:  # the `ocr` extra
        raise ImportError("OCR needs OpenCV and pyclipper: pip install 'libreyolo-graphs[ocr]'") from exc
    return cv2


def _pyclipper():
    try:
        import pyclipper
    except ImportError as exc:
        raise ImportError("OCR needs OpenCV and pyclipper: pip install 'libreyolo-graphs[ocr]'") from exc
    return pyclipper


def order_quads(quads: np.ndarray) -> np.ndarray:
    """(n, 4, 2) corners -> each quad's top-left, top-right, bottom-right, bottom-left: the two
    leftmost (by x, stable) are the left side, each side's upper corner first (stable: a tie keeps
    the x order) - PaddleOCR's ``order_points_clockwise``, for all quads at once."""
    quads = np.asarray(quads, dtype=np.float32).reshape(-1, 4, 2)
    idx = np.argsort(quads[:, :, 0], axis=1, kind="stable")
    pts = np.take_along_axis(quads, idx[:, :, None], axis=1)
    out = np.empty_like(pts)
    for side, (upper, lower) in ((pts[:, :2], (0, 3)), (pts[:, 2:], (1, 2))):
        swap = (side[:, 1, 1] < side[:, 0, 1])[:, None]
        out[:, upper] = np.where(swap, side[:, 1], side[:, 0])
        out[:, lower] = np.where(swap, side[:, 0], side[:, 1])
    return out


def order_quad(points: np.ndarray) -> np.ndarray:
    """Four corners -> top-left, top-right, bottom-right, bottom-left (:func:`order_quads` of one)."""
    return order_quads(points)[0]


def mini_box(points: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle of ``points``: its corners top-left, top-right, bottom-right,
    bottom-left exactly as PaddleOCR's ``get_mini_boxes`` orders them (OpenCV's corners sorted by
    x; of the two left ones the lower-y first unless the second is strictly lower; likewise the
    right ones), and its short side."""
    cv2 = _cv2()
    rect = cv2.minAreaRect(points.reshape(-1, 1, 2).astype(np.float32))
    pts = sorted(cv2.boxPoints(rect), key=lambda p: p[0])
    i1, i4 = (0, 1) if pts[1][1] > pts[0][1] else (1, 0)
    i2, i3 = (2, 3) if pts[3][1] > pts[2][1] else (3, 2)
    return np.array([pts[i1], pts[i2], pts[i3], pts[i4]], dtype=np.float32), float(min(rect[1]))


def box_score(prob: np.ndarray, quad: np.ndarray) -> float:
    """Mean of ``prob`` over the pixels inside ``quad`` (PaddleOCR's "fast" score: the quad's
    bounding box, masked by the quad filled at its corners truncated to integers)."""
    cv2 = _cv2()
    h, w = prob.shape
    xs, ys = quad[:, 0].tolist(), quad[:, 1].tolist()   # Python floats: scalar clipping without numpy's overhead
    x0 = min(max(math.floor(min(xs)), 0), w - 1)
    x1 = min(max(math.ceil(max(xs)), 0), w - 1)
    y0 = min(max(math.floor(min(ys)), 0), h - 1)
    y1 = min(max(math.ceil(max(ys)), 0), h - 1)
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    local = quad.astype(np.float32).copy()
    local[:, 0] -= x0
    local[:, 1] -= y0
    cv2.fillPoly(mask, local.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0])


def contour_score(prob: np.ndarray, contour: np.ndarray) -> float:
    """Mean of ``prob`` inside the contour itself (PaddleOCR's "slow" score)."""
    cv2 = _cv2()
    h, w = prob.shape
    c = contour.reshape(-1, 2).copy()
    x0, x1 = np.clip(c[:, 0].min(), 0, w - 1), np.clip(c[:, 0].max(), 0, w - 1)
    y0, y1 = np.clip(c[:, 1].min(), 0, h - 1), np.clip(c[:, 1].max(), 0, h - 1)
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    c[:, 0] -= x0
    c[:, 1] -= y0
    cv2.fillPoly(mask, c.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0])


def unclip(quad: np.ndarray, ratio: float) -> np.ndarray | None:
    """The quad grown by ``area * ratio / perimeter`` (pyclipper, round joins); None if it vanishes
    or splits (PaddleOCR keeps single-polygon expansions only)."""
    cv2, pyclipper = _cv2(), _pyclipper()
    area = abs(float(cv2.contourArea(quad.astype(np.float32))))
    length = float(cv2.arcLength(quad.reshape(-1, 1, 2).astype(np.float32), True))
    if length <= 0:
        return None
    off = pyclipper.PyclipperOffset()
    off.AddPath(quad, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    grown = off.Execute(area * ratio / length)
    if len(grown) != 1:
        return None
    return np.asarray(grown[0], dtype=np.float32)


@dataclass
class DBBoxes:
    """Quads (n, 4, 2) float32 in original-image pixels and their box scores (n,)."""

    quads: np.ndarray
    scores: np.ndarray


#: PaddleOCR's dilation kernel for the binary map (``use_dilation``)
DILATE_KERNEL = np.ones((2, 2), np.uint8)


def db_boxes(bitmap: np.ndarray, prob: np.ndarray, orig_hw: tuple[int, int], box_thresh: float,
             unclip_ratio: float, max_lines: int, *, dilate: bool = False, score_mode: str = "fast") -> DBBoxes:
    """DB post-process of one image, step for step PaddleOCR's ``DBPostProcess`` and its detector's
    ``filter_tag_det_res`` (see the module docstring). ``bitmap`` / ``prob``: the part of the
    detector's maps that the image covers; ``dilate``: the binary map dilated by a 2x2 kernel
    first (PaddleOCR's ``use_dilation``); ``score_mode``: "fast" (mean inside the minimum-area
    rectangle) or "slow" (inside the contour). At most ``max_lines`` boxes are kept (contours in
    OpenCV's order). Corners are integers, clipped to the image (``w - 1``, ``h - 1``)."""
    if score_mode not in ("fast", "slow"):
        raise ValueError(f"score_mode must be 'fast' or 'slow', got {score_mode!r}")
    cv2 = _cv2()
    if dilate:
        bitmap = cv2.dilate(bitmap, DILATE_KERNEL)
    empty = DBBoxes(np.zeros((0, 4, 2), np.float32), np.zeros((0,), np.float32))
    if not bitmap.any():   # nothing passed the threshold (a blank page): no contour search
        return empty
    mh, mw = bitmap.shape
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    kept_q: list[np.ndarray] = []
    kept_s: list[np.ndarray] = []
    pending_q: list[np.ndarray] = []
    pending_s: list[float] = []

    def flush() -> int:
        """Map the pending boxes back and filter them (all at once); returns how many are kept."""
        if pending_q:
            q, keep = _map_back(np.stack(pending_q), (mh, mw), orig_hw)
            kept_q.append(q)
            kept_s.append(np.asarray(pending_s, np.float32)[keep])
            pending_q.clear()
            pending_s.clear()
        return sum(len(k) for k in kept_s)

    n_kept = 0
    for contour in contours:
        quad, short = mini_box(contour)
        if short < MIN_SIZE:
            continue
        score = box_score(prob, quad) if score_mode == "fast" else contour_score(prob, contour)
        if box_thresh > score:
            continue
        grown = unclip(quad, unclip_ratio)
        if grown is None:
            continue
        quad, short = mini_box(grown)
        if short < MIN_SIZE + 2:
            continue
        pending_q.append(quad)
        pending_s.append(score)
        if n_kept + len(pending_q) >= max_lines:   # enough candidates: the last filter decides
            n_kept = flush()
            if n_kept >= max_lines:
                break
    if flush() == 0:
        return empty
    return DBBoxes(np.concatenate(kept_q)[:max_lines], np.concatenate(kept_s)[:max_lines])


def _map_back(quads: np.ndarray, map_hw: tuple[int, int], orig_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(n, 4, 2) quads in map pixels -> (kept quads in original-image pixels, keep mask (n,)):
    each axis scaled to the image and rounded, clipped to [0, side], truncated to integers,
    corners ordered (:func:`order_quads`), clipped to [0, side - 1], and quads with a side of 3
    pixels or less dropped (PaddleOCR's ``filter_tag_det_res``), all boxes at once."""
    mh, mw = map_hw
    oh, ow = orig_hw
    q = quads.astype(np.float32).copy()
    q[..., 0] = np.clip(np.round(q[..., 0] / mw * ow), 0, ow)
    q[..., 1] = np.clip(np.round(q[..., 1] / mh * oh), 0, oh)
    q = order_quads(q.astype(np.int32).astype(np.float32))
    q[..., 0] = np.minimum(np.maximum(q[..., 0], 0), ow - 1).astype(np.int32)
    q[..., 1] = np.minimum(np.maximum(q[..., 1], 0), oh - 1).astype(np.int32)
    top = np.sqrt(((q[:, 0] - q[:, 1]) ** 2).sum(-1)).astype(np.int64)
    left = np.sqrt(((q[:, 0] - q[:, 3]) ** 2).sum(-1)).astype(np.int64)
    keep = (top > MIN_SIZE) & (left > MIN_SIZE)
    return q[keep], keep


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


#: a recognition batch's width is its widest line's, rounded up to a multiple of this (the
#: recognizer needs multiples of 8; coarser steps bound the shapes a graph cache sees)
REC_WIDTH_STEP = 32
#: a line joins the current batch while its width is at most this factor of the batch's first
#: (narrowest) line's plus one step: padding stays small, so what a line reads does not change
REC_WIDTH_SPREAD = 1.25


def padded_width(width: int, step: int = REC_WIDTH_STEP) -> int:
    """``width`` rounded up to a multiple of ``step``."""
    return max(step, -(-int(width) // step) * step)


def rec_batches(lines: list[np.ndarray], batch: int, step: int = REC_WIDTH_STEP, spread: float = REC_WIDTH_SPREAD,
                rows: str = "exact") -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """Group resized (48-high) lines into recognition batches by similar width: ``(indices, uint8
    (rows, 48, width, 3) zero-padded, int32 (rows,) widths)``.

    Lines are taken narrowest first; a batch holds at most ``batch`` lines whose widths stay within
    ``spread`` times its first line's plus one ``step``, and is as wide as its widest line rounded
    up to a multiple of ``step`` - so each line is padded by little more than its own width, as
    PaddleOCR pads a batch to its widest line. ``rows``: "exact" (one row per line) or "pow2" (rows
    rounded up to a power of two, at most ``batch``, unused rows of width 0: fewer shapes for a
    graph cache; rows are computed independently, so this changes no line's result).
    """
    if rows not in ("exact", "pow2"):
        raise ValueError(f"rows must be 'exact' or 'pow2', got {rows!r}")
    order = sorted(range(len(lines)), key=lambda i: lines[i].shape[1])
    groups: list[list[int]] = []
    for i in order:
        w = lines[i].shape[1]
        if groups and len(groups[-1]) < batch and w <= lines[groups[-1][0]].shape[1] * spread + step:
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for part in groups:
        width = padded_width(max(lines[i].shape[1] for i in part), step)
        n = len(part) if rows == "exact" else min(batch, 1 << (len(part) - 1).bit_length())
        n = max(n, len(part))
        u8 = np.zeros((n, REC_HEIGHT, width, 3), dtype=np.uint8)
        widths = np.zeros((n,), dtype=np.int32)
        for r, i in enumerate(part):
            w = lines[i].shape[1]
            u8[r, :, :w] = lines[i]
            widths[r] = w
        out.append((part, u8, widths))
    return out
