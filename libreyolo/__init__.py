"""libreyolo: vision models with CUDA-graph accelerated inference, bit-for-bit against eager.

    from libreyolo import LibreYOLO, SAMPLE_IMAGE
    model = LibreYOLO("LibreYOLO9t.pt")
    results = model(SAMPLE_IMAGE, cuda_graph=True)
"""
from __future__ import annotations

__version__ = "0.1.0"

from .factory import LibreYOLO  # noqa: E402
from .assets import SAMPLE_IMAGE  # noqa: E402
from .models.registry import list_models  # noqa: E402

__all__ = ["LibreYOLO", "SAMPLE_IMAGE", "list_models", "__version__"]
