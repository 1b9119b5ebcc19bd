"""YOLOX declarations and its capturable inference stage."""
from __future__ import annotations

import torch
from torch import nn

from ..base import Model
from .nn import CONFIGS, YoloxNet, decode


class Yolox(Model):
    """YOLOX detector, sizes n, t, s, m, l, x (n uses depthwise-separable convs).

    The network takes BGR on a 0-255 scale with no mean/std; :meth:`infer` converts the
    library's RGB [0, 1] letterboxed canvas to that convention itself.
    """

    FAMILY = "yolox"
    TASK = "detect"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreYOLOX"
    # Set only after the GPU parity protocol passes for this family.
    SUPPORTS_CUDA_GRAPH = False
    DEFAULT_IMGSZ = 640

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return YoloxNet(size, nc)

    SIGNATURE_KEYS = ("backbone.backbone.stem.conv.conv.weight", "backbone.C3_n4.conv1.conv.weight",
                      "head.obj_preds.0.weight", "head.stems.0.conv.weight")
    NC_KEY = "head.cls_preds.0.weight"

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB in [0, 1] -> boxes (B, N, 4) xyxy canvas pixels, score (B, N), class (B, N)."""
        x = x.flip(1) * 255.0                      # RGB [0, 1] -> BGR [0, 255]
        maps = [m.float() for m in self.model(x)]
        return decode(maps)
