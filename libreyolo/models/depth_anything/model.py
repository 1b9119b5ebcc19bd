"""Depth Anything V2 declarations (monocular relative depth) and its capturable inference stage."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, PATCH, DepthAnythingNet


class DepthAnything(Model):
    """Depth Anything V2 (DINOv2 ViT-S/B/L encoder + DPT head), sizes s, b, l, task ``depth``.

    The network takes RGB in [0, 1] and applies the ImageNet mean / std itself, so the shared
    preprocessing only stretches the image to the ``imgsz`` x ``imgsz`` square (a multiple of the
    14 px patch; 518 by default, the position embedding's native size) and normalizes nothing.
    :meth:`infer` returns the relative inverse depth (B, 1, S, S); the depth task's stage maps it
    back to the image's own size (bilinear, align_corners=True) inside the same captured graph.

    The original release resizes keeping the aspect ratio (shorter side 518, bicubic, each side a
    multiple of 14); a square input keeps one graph per input size for every image shape, and
    the depth map is stretched back to the image, as the square exports of the model do.
    """

    FAMILY = "depth_anything"
    TASK = "depth"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreDepthAnythingV2"   # the LibreYOLO checkpoint names: LibreDepthAnythingV2s.pt, ...
    DEFAULT_IMGSZ = 518
    STRIDE = PATCH
    PREPROCESS = Preprocess("stretch")   # mean/std None: DepthAnythingNet normalizes internally

    SIGNATURE_KEYS = ("pretrained.pos_embed", "pretrained.mask_token", "depth_head.scratch.output_conv2.2.weight")

    def __init__(self, net: nn.Module, *, nc: int = 1, names: Any = None, **kwargs: Any):
        # one output channel, whatever a caller's generic default (nc=80) says
        super().__init__(net, nc=1, names=names if names is not None else {0: "depth"}, **kwargs)

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return DepthAnythingNet(size)

    @classmethod
    def nc_from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> int | None:
        return 1

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] -> float32 relative inverse depth (B, 1, S, S), >= 0."""
        return self.model(x).float()
