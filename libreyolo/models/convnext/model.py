"""ConvNeXt declarations: timm's ``convnext_tiny`` .. ``convnext_large``."""
from __future__ import annotations

from ..common.timm_net import TimmClassifier, TimmSize

#: the original (facebook) ImageNet-1k weights evaluate at 224 px with a 0.875 centre crop, bicubic
_EVAL = dict(imgsz=224, crop_pct=0.875, interpolation="bicubic")


class ConvNeXt(TimmClassifier):
    """ConvNeXt (v1) classifier: tiny, small, base, large."""

    FAMILY = "convnext"
    SIZES = ("t", "s", "b", "l")
    FILE_PREFIX = "LibreConvNeXt"
    CONFIGS = {s: TimmSize(f"convnext_{n}", **_EVAL)
               for s, n in zip(SIZES, ("tiny", "small", "base", "large"))}
    SIGNATURE_KEYS = ("stem.0.weight", "stages.0.blocks.0.conv_dw.weight", "stages.0.blocks.0.gamma",
                      "head.norm.weight", "head.fc.weight")
    NC_KEY = "head.fc.weight"
