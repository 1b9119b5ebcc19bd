"""Deep OC-SORT (Maggiolino et al., 2023) on the ``trackers`` package's OC-SORT: OC-SORT's motion
association (Kalman filter, observation-centric momentum and recovery) with an appearance term
in its first association - each track's embedding kept as an exponential average whose weight
follows the detection's confidence (the paper's dynamic appearance), and the appearance cost
weighted per track and per detection by how distinctive its best match is (adaptive weighting).

The embeddings come from ``embedder(frame, boxes) -> (N, D)`` (``frame``: the RGB image, ``boxes``:
``(N, 4)`` xyxy pixels): a ReID network of the user's. The default, :class:`ColorHistogramEmbedder`,
needs no weights (none ship with LibreYOLO, and nothing is downloaded): per-channel colour
histograms of the box's upper and lower halves. The paper's camera-motion compensation is not
part of this tracker (BoT-SORT's is: ``tracker="botsort"``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

__all__ = ["ColorHistogramEmbedder", "adaptive_appearance_cost", "make_deep_ocsort"]


class ColorHistogramEmbedder:
    """Appearance without a network: for each box, ``bins`` per-channel histograms of its upper
    and lower halves (clothes above, clothes below, for people), concatenated and L2-normalised:
    a ``6 * bins`` vector. Cheap and deterministic; a ReID network separates look-alikes far
    better."""

    def __init__(self, bins: int = 16):
        self.bins = int(bins)

    def __call__(self, frame: np.ndarray, boxes: np.ndarray) -> np.ndarray:
        h, w = frame.shape[:2]
        out = np.zeros((len(boxes), 6 * self.bins), np.float32)
        for i, (x1, y1, x2, y2) in enumerate(np.asarray(boxes, np.float64)):
            x1, x2 = int(np.clip(np.floor(x1), 0, w - 1)), int(np.clip(np.ceil(x2), 1, w))
            y1, y2 = int(np.clip(np.floor(y1), 0, h - 1)), int(np.clip(np.ceil(y2), 1, h))
            crop = frame[y1:max(y2, y1 + 1), x1:max(x2, x1 + 1)]
            mid = max(1, crop.shape[0] // 2)
            parts = []
            for half in (crop[:mid], crop[mid:] if crop.shape[0] > 1 else crop):
                for c in range(3):
                    hist, _ = np.histogram(half[..., c], bins=self.bins, range=(0, 256))
                    parts.append(hist.astype(np.float32))
            v = np.concatenate(parts)
            out[i] = v / max(float(np.linalg.norm(v)), 1e-12)
        return out


def adaptive_appearance_cost(similarity: np.ndarray, weight: float, bottom: float = 0.5) -> np.ndarray:
    """Deep OC-SORT's adaptive weighting: ``similarity`` (tracks x detections, cosine, >= 0)
    times ``weight`` times, per row and per column, how far its best entry stands out from the
    second (1 where the second is at most ``bottom`` of the best, falling to 0 where they are
    equal); a row or column of one entry keeps its weight."""
    w = np.full_like(similarity, weight, dtype=np.float64)
    for axis in (0, 1):
        s = similarity if axis == 0 else similarity.T
        ww = w if axis == 0 else w.T
        if s.shape[1] < 2:
            continue
        top2 = -np.sort(-s, axis=1)[:, :2]
        ratio = np.divide(top2[:, 1], top2[:, 0], out=np.ones(len(s)), where=top2[:, 0] > 0)
        factor = 1.0 - np.maximum(ratio - bottom, 0.0) / (1.0 - bottom)
        ww *= factor[:, None]
    return w * similarity


def _tracker_base() -> type:
    from trackers import OCSORTTracker
    return OCSORTTracker


def make_deep_ocsort(embedder: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                     appearance_weight: float = 0.75, adaptive_bottom: float = 0.5, alpha_fixed: float = 0.95,
                     **ocsort_kwargs: Any) -> Any:
    """A Deep OC-SORT tracker: ``trackers.OCSORTTracker(**ocsort_kwargs)`` with the appearance
    term (module docstring). ``appearance_weight``: the appearance cost's weight beside IoU (0.75
    in the paper), ``adaptive_bottom``: the adaptive weighting's floor ratio (0.5),
    ``alpha_fixed``: the embedding average's weight of the past for a detection of full
    confidence (0.95)."""
    base = _tracker_base()
    cls = _deep_class(base)
    return cls(embedder=embedder, appearance_weight=appearance_weight, adaptive_bottom=adaptive_bottom,
               alpha_fixed=alpha_fixed, **ocsort_kwargs)


_CLASSES: dict[type, type] = {}


def _deep_class(base: type) -> type:
    """The Deep OC-SORT subclass of ``trackers.OCSORTTracker`` (made once)."""
    if base in _CLASSES:
        return _CLASSES[base]
    from trackers.core.ocsort.tracklet import OCSORTTracklet

    class Tracklet(OCSORTTracklet):
        """An OC-SORT tracklet with its appearance: the embedding average."""

        embedding: np.ndarray | None = None
        owner: Any = None

        def update(self, bbox, *args: Any, **kwargs: Any) -> None:
            super().update(bbox, *args, **kwargs)
            owner = self.owner
            if owner is not None and bbox is not None:
                found = owner._pending.get(tuple(np.asarray(bbox, np.float64).round(4).tolist()))
                if found is not None:
                    self.embedding = owner._blend(self.embedding, *found)

    class DeepOCSORT(base):
        __doc__ = make_deep_ocsort.__doc__
        tracker_id = "deepocsort"
        #: the trackers package's tuning space is OC-SORT's, over keywords this class passes on
        search_space: ClassVar[dict] = {}
        #: the glue passes the frame (its appearance is read from it)
        needs_frame = True

        def __init__(self, embedder=None, appearance_weight=0.75, adaptive_bottom=0.5, alpha_fixed=0.95,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.embedder = embedder if embedder is not None else ColorHistogramEmbedder()
            self.appearance_weight = float(appearance_weight)
            self.adaptive_bottom = float(adaptive_bottom)
            self.alpha_fixed = float(alpha_fixed)
            self._pending: dict[tuple, tuple[np.ndarray, float]] = {}
            self._appearance: np.ndarray | None = None

        def _blend(self, old: np.ndarray | None, new: np.ndarray, score: float) -> np.ndarray:
            """Dynamic appearance: the past's weight ``alpha`` grows as the detection's
            confidence falls towards the detection threshold (a poor detection changes little)."""
            if old is None:
                return new
            sigma = float(self.high_conf_det_threshold)
            trust = 1.0 - (score - sigma) / max(1.0 - sigma, 1e-6)
            alpha = self.alpha_fixed + (1.0 - self.alpha_fixed) * float(np.clip(trust, 0.0, 1.0))
            mixed = alpha * old + (1.0 - alpha) * new
            return mixed / max(float(np.linalg.norm(mixed)), 1e-12)

        def update(self, detections, frame=None, timestamp=None):
            self._pending, self._appearance = {}, None
            if frame is not None and len(detections) > 0:
                rgb = np.ascontiguousarray(np.asarray(frame)[:, :, ::-1])   # the trackers package's BGR
                emb = np.asarray(self.embedder(rgb, np.asarray(detections.xyxy)), np.float64)
                if emb.ndim != 2 or len(emb) != len(detections):
                    raise ValueError(f"the embedder returned an array of shape {emb.shape} for "
                                     f"{len(detections)} boxes; it must be (boxes, features)")
                emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
                conf = (np.asarray(detections.confidence, np.float64) if detections.confidence is not None
                        else np.ones(len(detections)))
                high = conf >= self.high_conf_det_threshold if detections.confidence is not None \
                    else np.ones(len(detections), bool)
                for box, e, s in zip(np.asarray(detections.xyxy, np.float64), emb, conf):
                    self._pending[tuple(box.round(4).tolist())] = (e, float(s))
                self._appearance = emb[high]
                self._first = True
            return super().update(detections, None, timestamp)

        def _get_associated_indices(self, iou_matrix, direction_consistency_matrix):
            if getattr(self, "_first", False) and self._appearance is not None and iou_matrix.size:
                self._first = False
                tracks = np.stack([t.embedding if getattr(t, "embedding", None) is not None
                                   else np.zeros(self._appearance.shape[1]) for t in self.tracks])
                similarity = np.clip(tracks @ self._appearance.T, 0.0, None)
                similarity[iou_matrix <= 0] = 0.0   # appearance refines motion, never replaces it
                extra = adaptive_appearance_cost(similarity, self.appearance_weight, self.adaptive_bottom)
                if direction_consistency_matrix is None:
                    direction_consistency_matrix = np.zeros_like(iou_matrix)
                    if self.direction_consistency_weight == 0:
                        return self._assign(iou_matrix, iou_matrix + extra)
                weighted = self.direction_consistency_weight * direction_consistency_matrix
                return self._assign(iou_matrix, iou_matrix + weighted + extra)
            self._first = False
            return super()._get_associated_indices(iou_matrix, direction_consistency_matrix)

        def _assign(self, iou_matrix, cost):
            """OC-SORT's assignment on ``cost``, a pair kept where its IoU reaches the threshold."""
            from scipy.optimize import linear_sum_assignment
            n_tracks, n_dets = iou_matrix.shape
            rows, cols = linear_sum_assignment(cost, maximize=True)
            matched = [(int(r), int(c)) for r, c in zip(rows, cols) if iou_matrix[r, c] >= self.minimum_iou_threshold]
            used_r, used_c = {r for r, _ in matched}, {c for _, c in matched}
            return (matched, [r for r in range(n_tracks) if r not in used_r],
                    [c for c in range(n_dets) if c not in used_c])

        def _spawn_new_tracklets(self, boxes):
            before = len(self.tracks)
            super()._spawn_new_tracklets(boxes)
            for i, box in zip(range(before, len(self.tracks)), np.asarray(boxes, np.float64)):
                old = self.tracks[i]
                t = Tracklet.__new__(Tracklet)
                t.__dict__.update(old.__dict__)
                t.owner = self
                found = self._pending.get(tuple(box.round(4).tolist()))
                t.embedding = found[0] if found is not None else None
                self.tracks[i] = t

        def reset(self) -> None:
            super().reset()
            self._pending, self._appearance = {}, None

    DeepOCSORT.__name__ = DeepOCSORT.__qualname__ = "DeepOCSORTTracker"
    _CLASSES[base] = DeepOCSORT
    return DeepOCSORT
