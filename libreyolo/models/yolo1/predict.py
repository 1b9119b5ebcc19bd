"""The predictor of YOLOv1: the engine's, refusing any input size but the fixed 448."""
from __future__ import annotations

from ...engine.predictor import Predictor
from ...tasks.base import PredictPlan
from .nn import INPUT_SIZE, input_size_error


class FixedSizePredictor(Predictor):
    """:class:`~libreyolo.engine.predictor.Predictor` whose plan (made by predict, track and
    capture_graph before any source is read) refuses an ``imgsz`` other than 448."""

    def plan(self, size: int, **opts) -> PredictPlan:
        if int(size) != INPUT_SIZE:
            raise input_size_error(f"imgsz={size}")
        return super().plan(size, **opts)
