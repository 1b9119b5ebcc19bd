"""YOLOv9-P2 declarations: YOLOv9's predict stage and loss with the extra stride-4 level."""
from __future__ import annotations

from torch import nn

from ..yolo9.model import Yolo9
from .nn import CONFIGS, STRIDES, Yolo9P2Net


class Yolo9P2(Yolo9):
    """YOLOv9-P2 (GELAN with a stride-4 head for small objects), sizes t and s."""

    FAMILY = "yolo9_p2"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreYOLO9P2"
    # Both passed on the GPU: the parity protocol and the training-step parity rows
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return Yolo9P2Net(size, nc)

    SIGNATURE_KEYS = ("backbone.elan1.cv1.conv.weight", "neck.elan_up3.cv4.conv.weight", "head.cv3.3.2.weight")
    NC_KEY = "head.cv3.0.2.weight"
    VARIANT_KEYS = ()

    def build_loss(self) -> nn.Module:
        from ..yolo9.loss import Yolo9Loss
        return Yolo9Loss(self.nc, strides=STRIDES)
