"""MobileNetV4 declarations: timm's ``mobilenetv4_conv_*`` and ``mobilenetv4_hybrid_*``."""
from __future__ import annotations

from ..common.timm_net import TimmClassifier, TimmSize


class MobileNetV4(TimmClassifier):
    """MobileNetV4 classifier: conv-small (``s``), conv-medium (``m``), conv-large (``l``),
    hybrid-medium (``hm``) and hybrid-large (``hl``, with Mobile MQA attention blocks).

    Evaluation as the ImageNet-1k weights were: s 224 px crop 0.875, m 224 px 0.95, l 256 px 0.95,
    hm 224 px 0.95, hl 384 px 0.95 (bicubic)."""

    FAMILY = "mobilenetv4"
    SIZES = ("s", "m", "l", "hm", "hl")
    FILE_PREFIX = "LibreMobileNetV4"
    CONFIGS = {
        "s": TimmSize("mobilenetv4_conv_small", imgsz=224, crop_pct=0.875),
        "m": TimmSize("mobilenetv4_conv_medium", imgsz=224, crop_pct=0.95),
        "l": TimmSize("mobilenetv4_conv_large", imgsz=256, crop_pct=0.95),
        "hm": TimmSize("mobilenetv4_hybrid_medium", imgsz=224, crop_pct=0.95),
        "hl": TimmSize("mobilenetv4_hybrid_large", imgsz=384, crop_pct=0.95),
    }
    # universal inverted bottleneck (UIB) blocks of stage 2: EfficientNetV2 has none
    SIGNATURE_KEYS = ("conv_stem.weight", "blocks.2.0.dw_start.conv.weight", "blocks.2.0.pw_exp.conv.weight",
                      "conv_head.weight", "classifier.weight")
    NC_KEY = "classifier.weight"
