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
    #: ResNet keeps the classic SGD recipe (the torchvision one: Nesterov momentum 0.9, weight
    #: decay 1e-4, lr 0.1 per 256 images -> 0.01 at a batch of ~26, cosine to 1 %, one warm-up
    #: epoch from lr 0 for every group). SGD is also what a fully captured training step
    #: (update included) needs.
    TRAIN_DEFAULTS = {**TimmClassifier.TRAIN_DEFAULTS, "optimizer": "SGD", "lr0": 0.01, "momentum": 0.9,
                      "weight_decay": 1e-4}
