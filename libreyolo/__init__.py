"""libreyolo: vision models with CUDA-graph accelerated inference, bit-for-bit against eager.

    from libreyolo import LibreYOLO, SAMPLE_IMAGE
    model = LibreYOLO("LibreYOLO9t.pt")
    results = model(SAMPLE_IMAGE, cuda_graph=True)

The names below are imported on first use (PEP 562), so that ``import libreyolo.cli`` (the
``libreyolo`` program) does not import torch before it has parsed its command line: its help and
a bad option's message come without torch's import.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["LibreYOLO", "SAMPLE_IMAGE", "list_models", "__version__"]

_LAZY = {"LibreYOLO": (".factory", "LibreYOLO"), "SAMPLE_IMAGE": (".assets", "SAMPLE_IMAGE"),
         "list_models": (".models.registry", "list_models")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
        globals()[name] = value   # later lookups find it directly
        return value
    raise AttributeError(f"module 'libreyolo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
