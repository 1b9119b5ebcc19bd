"""ResNet declarations: timm's ``resnet18`` .. ``resnet152`` (the torchvision layout)."""
from __future__ import annotations

from ..common.timm_net import TimmClassifier, TimmSize

#: timm's ImageNet-1k "A1" weights evaluate at 224 px with a 0.95 centre crop, bicubic
_EVAL = dict(imgsz=224, crop_pct=0.95, interpolation="bicubic")


class ResNet(TimmClassifier):
    """ResNet classifier; 18 and 34 use basic blocks, 50, 101 and 152 bottlenecks."""

    FAMILY = "resnet"
    SIZES = ("18", "34", "50", "101", "152")
    FILE_PREFIX = "LibreResNet"
    CONFIGS = {s: TimmSize(f"resnet{s}", **_EVAL) for s in SIZES}
    SIGNATURE_KEYS = ("conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer4.0.conv1.weight", "fc.weight")
    NC_KEY = "fc.weight"
    # Training: the shared AdamW recipe. The classic SGD one (Nesterov, momentum 0.9, weight decay
    # 1e-4, lr 0.1 per 256 images) is optimizer="SGD", lr0=..., momentum=0.9, weight_decay=1e-4 -
    # and is what a fully captured training step (update included) needs; from scratch on small
    # sets it learns far slower than AdamW (docs/families.md).
