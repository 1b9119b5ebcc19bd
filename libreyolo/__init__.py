"""libreyolo: vision models with CUDA-graph accelerated inference, bit-for-bit against eager.

    from libreyolo import LibreYOLO, SAMPLE_IMAGE
    model = LibreYOLO("LibreYOLO9t.pt")
    result = model(SAMPLE_IMAGE, cuda_graph=True)   # one image: one Results

The names below are imported on first use (PEP 562), so that ``import libreyolo.cli`` (the
``libreyolo`` program) does not import torch before it has parsed its command line: its help and
a bad option's message come without torch's import.
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {"LibreYOLO": (".factory", "LibreYOLO"), "SAMPLE_IMAGE": (".assets", "SAMPLE_IMAGE"),
         "list_models": (".models.registry", "list_models")}

#: LibreYOLO 1.6.0's names for the families (``LibreYOLO9``...) and result types (``Results``,
#: ``Boxes``...), kept so that code written for it runs here (libreyolo/compat.py; which of its
#: names are not offered and why: docs/reference-api.md). Listed here so that naming them
#: imports nothing: the registry's table holds the family names.
_FAMILY_NAMES: tuple[str, ...] = ("LibreYOLO9", "LibreYOLOX", "LibreYOLO7", "LibreRTMDet", "LibrePICODET", "LibreRTDETR",
                 "LibreRTDETRv2", "LibreDFINE", "LibreDEIM", "LibreDEIMv2", "LibreEC", "LibreRTDETRv4",
                 "LibreResNet", "LibreEfficientNetV2", "LibreMobileNetV4", "LibreConvNeXt", "LibreSegformer",
                 "LibreMobileSAM", "LibreDepthAnythingV2", "LibreBiRefNet", "LibrePPOCR", "LibreYOLO9P2",
                 "LibreYOLO9E2E", "LibreYOLO1", "LibreYOLO2", "LibreYOLO3", "LibreYOLO4", "LibrePPYOLOE",
                 "LibreYOLONAS", "LibreDepthAnything3", "LibreZipDepth", "LibreFeyNobg", "LibrePIDNet",
                 "LibreLingBotVision")
_FAMILY_NAMES += ("LibreFOMO",)
_FAMILY_NAMES += ("LibreCLIP", "LibreSigLIP2")
_FAMILY_NAMES += ("LibreEoMT",)
_FAMILY_NAMES += ("LibreNAFNet", "LibreRealESRGAN", "LibreSwinIR")
_FAMILY_NAMES += ("LibreSAM2", "LibreEdgeTAM")
_FAMILY_NAMES += ("LibreSAM1", "LibrePicoSAM3")
_FAMILY_NAMES += ("LibreSAM3",)
_RESULT_NAMES: tuple[str, ...] = ("Results", "Boxes", "Probs", "SemanticMask", "DepthMap", "Matte", "OCRRegions", "Masks",
                 "Keypoints")
_RESULT_NAMES += ("PanopticSegmentation",)
_RESULT_NAMES += ("Points",)

__all__ = ["LibreYOLO", "SAMPLE_IMAGE", "list_models", "__version__",
           "LibreYOLO9", "LibreYOLOX", "LibreYOLO7", "LibreRTMDet", "LibrePICODET", "LibreRTDETR", "LibreRTDETRv2",
           "LibreDFINE", "LibreDEIM", "LibreDEIMv2", "LibreEC", "LibreRTDETRv4", "LibreResNet", "LibreEfficientNetV2",
           "LibreMobileNetV4", "LibreConvNeXt", "LibreSegformer", "LibreMobileSAM", "LibreDepthAnythingV2",
           "LibreBiRefNet", "LibrePPOCR", "LibreYOLO9P2", "LibreYOLO9E2E", "LibreYOLO1", "LibreYOLO2", "LibreYOLO3",
           "LibreYOLO4", "LibrePPYOLOE", "LibreYOLONAS", "LibreDepthAnything3", "LibreZipDepth", "LibreFeyNobg",
           "LibrePIDNet", "LibreLingBotVision",
           "LibreCLIP", "LibreSigLIP2",
           "LibreNAFNet", "LibreRealESRGAN", "LibreSwinIR",
           "Results", "Boxes", "Probs", "SemanticMask", "DepthMap", "Matte", "OCRRegions", "Masks", "Keypoints"]
__all__ += ["LibreEoMT", "PanopticSegmentation"]
__all__ += ["LibreSAM2", "LibreEdgeTAM"]
__all__ += ["LibreFOMO", "Points"]
__all__ += ["LibreSAM1", "LibrePicoSAM3"]
__all__ += ["LibreSAM3"]


def __getattr__(name: str):
    import importlib
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
    elif name in _FAMILY_NAMES:
        from .compat import family_alias
        value = family_alias(name)
    elif name in _RESULT_NAMES:
        from .compat import RESULT_TYPES
        module, attr = RESULT_TYPES[name]
        value = getattr(importlib.import_module(module, __name__), attr)
    elif name == "LibreYOLORTDETR":   # renamed there too, and still accepted with a warning
        import warnings
        warnings.warn("LibreYOLORTDETR is LibreRTDETR: import that name", DeprecationWarning, stacklevel=2)
        return globals().get("LibreRTDETR") or __getattr__("LibreRTDETR")
    else:
        raise AttributeError(f"module 'libreyolo' has no attribute {name!r}")
    globals()[name] = value   # later lookups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_FAMILY_NAMES) | set(_RESULT_NAMES))
