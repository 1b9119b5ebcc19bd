"""The predictor of EoMT: the engine's, refusing any input size but the network's fixed one."""
from __future__ import annotations

from ...engine.predictor import Predictor
from ...tasks.base import PredictPlan


class FixedSizePredictor(Predictor):
    """:class:`~libreyolo.engine.predictor.Predictor` whose plan (made by predict, track and
    capture_graph before any source is read) refuses an ``imgsz`` other than the network's."""

    def plan(self, size: int, **opts) -> PredictPlan:
        self.model.check_imgsz(size)
        return super().plan(size, **opts)
