"""EfficientNetV2 declarations: timm's ``tf_efficientnetv2_*`` (the TensorFlow-original layers,
'same' padding included, as the LibreYOLO checkpoints hold them)."""
from __future__ import annotations

from ..common.timm_net import INCEPTION_MEAN, INCEPTION_STD, TimmClassifier, TimmSize

_TF = dict(mean=INCEPTION_MEAN, std=INCEPTION_STD)


class EfficientNetV2(TimmClassifier):
    """EfficientNetV2 classifier. Each size evaluates at its own resolution (timm's test sizes of
    the ImageNet-1k weights): b0 224, b1 240, b2 260, b3 300, s 384, m and l 480; s, m and l were
    trained in TensorFlow on [-1, 1] inputs (mean = std = 0.5)."""

    FAMILY = "efficientnetv2"
    SIZES = ("b0", "b1", "b2", "b3", "s", "m", "l")
    FILE_PREFIX = "LibreEfficientNetV2"
    #: 4, not 32: the evaluation sizes 240, 260 and 300 are no multiples of 32 (the network pools
    #: globally, any size runs); predict rounds imgsz up to a multiple of this
    STRIDE = 4
    CONFIGS = {
        "b0": TimmSize("tf_efficientnetv2_b0", imgsz=224, crop_pct=0.875),
        "b1": TimmSize("tf_efficientnetv2_b1", imgsz=240, crop_pct=0.882),
        "b2": TimmSize("tf_efficientnetv2_b2", imgsz=260, crop_pct=0.89),
        "b3": TimmSize("tf_efficientnetv2_b3", imgsz=300, crop_pct=0.904),
        "s": TimmSize("tf_efficientnetv2_s", imgsz=384, crop_pct=1.0, **_TF),
        "m": TimmSize("tf_efficientnetv2_m", imgsz=480, crop_pct=1.0, **_TF),
        "l": TimmSize("tf_efficientnetv2_l", imgsz=480, crop_pct=1.0, **_TF),
    }
    # fused-MBConv (EdgeResidual) stage 1 + a squeeze-excite MBConv stage: MobileNetV4 has neither
    SIGNATURE_KEYS = ("conv_stem.weight", "blocks.1.0.conv_exp.weight", "blocks.1.0.conv_pwl.weight",
                      "blocks.3.0.se.conv_reduce.weight", "conv_head.weight", "classifier.weight")
    NC_KEY = "classifier.weight"
