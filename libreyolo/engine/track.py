"""Multi-object tracking on top of predict: ``model.track(source, tracker="bytetrack")``.

The trackers are those of the ``trackers`` package (Roboflow's clean-room ByteTrack, BoT-SORT and
OC-SORT, Apache-2.0, built on ``supervision.Detections``): Kalman filters and assignment are
theirs, not written here. Deep OC-SORT is their OC-SORT with the appearance term added
(:mod:`libreyolo.engine.deepocsort`). ``supervision`` itself shipped a ByteTrack until 0.26 and has moved it to that
package since; it has never had a BoT-SORT. Their BoT-SORT is the motion part of the method
(Kalman filter, two-stage association, camera-motion compensation from sparse optical flow on the
frame); it has no appearance (ReID) model.

A tracker runs on the host after each frame's Results are made (:class:`TrackGlue`, the
predictor's ``on_results`` hook): the captured stage - preprocessing, network, top-k/NMS - is the
same as in predict. Tracked Results hold the boxes of confirmed tracks only, each with its id in
``boxes.id``, and ``trails``: each id's recent box centres, which ``plot()`` draws.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any

import numpy as np
import torch

from ..results import Boxes, Results

__all__ = ["TRACKERS", "TRAIL_LENGTH", "make_tracker", "TrackGlue"]

log = logging.getLogger(__name__)

#: Tracker names ``model.track`` takes (or pass a tracker object; see :func:`make_tracker`).
TRACKERS: tuple[str, ...] = ("bytetrack", "botsort", "ocsort", "deepocsort")
#: Box centres kept per track for ``plot()``'s trails.
TRAIL_LENGTH = 30
#: Detection-score thresholds of the named trackers: a detection from ``HIGH`` on enters the first
#: association and may start a track, those between predict's ``conf`` and it only extend tracks
#: (ByteTrack's second stage). The trackers package's own defaults (0.6 / 0.7) suit detectors that
#: score higher than ours; these follow the common YOLO tracking setting.
HIGH = 0.25


def make_tracker(tracker: Any, frame_rate: float = 30.0) -> Any:
    """A fresh tracker for ``tracker``: ``"bytetrack"``, ``"botsort"``, ``"ocsort"`` or
    ``"deepocsort"`` (a trailing ``.yaml`` is ignored), built for ``frame_rate`` frames per second;
    or a tracker object (anything with ``update(detections, ...)`` and ``reset()``: one of the
    ``trackers`` package, or :func:`libreyolo.engine.deepocsort.make_deep_ocsort`'s), used as
    given, which is how to set its own options (``trackers.ByteTrackTracker(lost_track_buffer=60)``,
    ``make_deep_ocsort(embedder=my_reid)``)."""
    if not isinstance(tracker, str):
        if not callable(getattr(tracker, "update", None)):
            raise TypeError(f"tracker must be one of {', '.join(TRACKERS)} or a tracker object with update(); "
                            f"got {type(tracker).__name__}")
        return tracker
    name = tracker.strip().lower().removesuffix(".yaml").removesuffix(".yml")
    if name not in TRACKERS:
        raise ValueError(f"unknown tracker {tracker!r}; available: {', '.join(TRACKERS)} (or pass a tracker "
                         "object of the trackers package)")
    try:
        import trackers
    except ImportError as exc:
        raise ImportError("tracking needs the trackers package: pip install 'libreyolo-graphs[track]'") from exc
    if name in ("ocsort", "deepocsort"):   # no second, low-score stage: HIGH is where detections count
        if name == "ocsort":
            return trackers.OCSORTTracker(frame_rate=float(frame_rate), high_conf_det_threshold=HIGH)
        from .deepocsort import make_deep_ocsort
        return make_deep_ocsort(frame_rate=float(frame_rate), high_conf_det_threshold=HIGH)
    common = dict(frame_rate=float(frame_rate), track_activation_threshold=HIGH, high_conf_det_threshold=HIGH)
    if name == "bytetrack":
        return trackers.ByteTrackTracker(**common)
    return trackers.BoTSORTTracker(**common)


#: the tasks whose Results carry axis-aligned boxes a tracker can follow; instance masks and
#: keypoints are kept with their boxes (oriented boxes are not tracked: the trackers' motion model
#: and association are axis-aligned boxes)
TRACKABLE_TASKS = ("detect", "segment", "pose")


def check_trackable(model) -> None:
    """One clear error for a model whose task cannot be tracked."""
    if model.TASK not in TRACKABLE_TASKS:
        raise ValueError(f"model.track follows boxes: it needs a detection, instance segmentation or pose model; "
                         f"{model.FAMILY}-{model.size}'s task is {model.TASK!r}")


class TrackGlue:
    """Feeds each Results of one source to its tracker and writes the ids back (see the module
    docstring). ``update(result, frame)`` replaces ``result.boxes`` by the tracked boxes, and
    ``result.masks`` / ``result.keypoints`` (instance segmentation, pose) by the same rows, so
    each mask or skeleton stays with its box and id."""

    def __init__(self, tracker: Any, frame_rate: float = 30.0):
        self.spec = tracker
        self.tracker = make_tracker(tracker, frame_rate)
        # BoT-SORT's camera-motion compensation and Deep OC-SORT's appearance read the frame;
        # ByteTrack and OC-SORT warn when given one
        self.wants_frame = bool(getattr(self.tracker, "enable_cmc", False) or getattr(self.tracker, "needs_frame", False))
        self.trails: dict[int, deque] = {}
        self._last_seen: dict[int, int] = {}
        self._last_time: float | None = None
        self.frames = 0

    def reset(self) -> None:
        if callable(getattr(self.tracker, "reset", None)):
            self.tracker.reset()
        self.trails.clear()
        self._last_seen.clear()
        self._last_time = None
        self.frames = 0

    def update(self, result: Results, frame: np.ndarray | None = None, timestamp: float | None = None) -> Results:
        """Track ``result`` (one frame, in order); ``frame`` is its RGB image (BoT-SORT's
        camera-motion compensation reads it), ``timestamp`` its time in seconds: with it the
        Kalman filters step by the real time between frames (``vid_stride``, frames a live
        source dropped); without it, or when it does not increase, by one frame."""
        import supervision as sv

        boxes = result.boxes
        if boxes is None:
            raise ValueError("tracking needs boxes: model.track works with detection, instance segmentation and "
                             "pose models only")
        data = boxes.data
        rows = data.detach().float().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data, np.float32)
        dets = sv.Detections(xyxy=rows[:, :4].astype(np.float32), confidence=rows[:, 4].astype(np.float32),
                             class_id=rows[:, 5].astype(int), data={"index": np.arange(len(rows))})
        if timestamp is not None and self._last_time is not None and timestamp <= self._last_time:
            timestamp = None  # a new pass over the source (persist=True): step by one frame
        self._last_time = timestamp
        kw: dict[str, Any] = {"timestamp": timestamp}
        if self.wants_frame and frame is not None:
            # OpenCV's channel order for the tracker's optical flow (grey from BGR weights)
            kw["frame"] = np.ascontiguousarray(np.asarray(frame)[:, :, ::-1])
        tracked = self.tracker.update(dets, **kw)
        ids = np.asarray(tracked.tracker_id if tracked.tracker_id is not None else [], dtype=np.int64)
        keep = ids >= 0  # -1: a detection no confirmed track holds
        index = np.asarray(tracked.data.get("index", np.zeros(0, int)), dtype=np.int64)[keep]
        ids = ids[keep]
        order = np.argsort(index, kind="stable")  # the detections' own (score) order
        index, ids = index[order], ids[order]
        if isinstance(data, torch.Tensor):
            picked = data[torch.as_tensor(index, device=data.device)]
            id_col = torch.as_tensor(ids, device=data.device)
        else:
            picked, id_col = data[index], ids
        result.boxes = Boxes(picked, boxes.orig_shape, id_col)
        for field in ("masks", "keypoints"):   # per-instance rows in the boxes' order
            rows_of = getattr(result, field, None)
            if rows_of is not None and len(rows_of) == len(rows):
                d = rows_of.data
                setattr(result, field, rows_of[torch.as_tensor(index, device=d.device)
                                               if isinstance(d, torch.Tensor) else index])
        self.frames += 1
        self._update_trails(rows[index], ids)
        result.trails = {int(i): list(self.trails[int(i)]) for i in ids}
        return result

    def _update_trails(self, rows: np.ndarray, ids: np.ndarray) -> None:
        for (x1, y1, x2, y2), tid in zip(rows[:, :4], ids):
            t = int(tid)
            trail = self.trails.get(t)
            if trail is None:
                trail = self.trails[t] = deque(maxlen=TRAIL_LENGTH)
            trail.append((float(x1 + x2) / 2, float(y1 + y2) / 2))
            self._last_seen[t] = self.frames
        stale = [t for t, seen in self._last_seen.items() if self.frames - seen > TRAIL_LENGTH]
        for t in stale:  # tracks gone for a while: forget their trails (memory stays bounded)
            del self.trails[t], self._last_seen[t]
