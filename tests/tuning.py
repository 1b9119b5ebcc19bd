"""The ``tune`` options' defaults changed for a test (as a caller passing them to every run would)."""
from __future__ import annotations

from libreyolo.engine.config import TuneConfig


def tune_defaults(monkeypatch, **values) -> None:
    """Every TrainConfig made while ``monkeypatch`` holds gets ``values`` in its ``tune`` group,
    unless the caller passes those options itself."""
    real = TuneConfig.__init__

    def init(self, **kw):
        real(self, **{**values, **kw})

    monkeypatch.setattr(TuneConfig, "__init__", init)
