"""Depth Anything 3 declarations (DA3-Mono: monocular relative depth)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..depth_anything.model import DepthAnything, DepthFamily
from .nn import CONFIGS, PATCH, DepthAnything3Net


class DepthAnything3(DepthFamily):
    """Depth Anything 3, DA3-Mono-Large (DINOv2 ViT-L/14 + DPT head with a sky branch), size l,
    task ``depth``; its own family beside Depth Anything V2 (another layout, another output: the
    network predicts log depth and a sky score, and returns the relative inverse depth after
    DA3's sky step - see :mod:`.nn`).

    Preprocessing as data: the network normalizes its [0, 1] RGB input itself (mean/std None);
    the image keeps its aspect ratio, the shorter side to ``imgsz`` (504 by default, DA3's
    processing resolution), each side a multiple of the 14 px patch, bicubic on float pixels -
    Depth Anything V2's rule. DA3's own default bounds the longer side instead
    (``upper_bound_resize``: 378 x 504 for a 4:3 image at 504, cubic when enlarging, OpenCV's
    area filter when shrinking); the depth task's resizes keep the shorter side or stretch, so
    at the same ``imgsz`` this family sees more of the image than DA3's default (docs/families.md).
    """

    FAMILY = "depth_anything3"
    SUPPORTS_CUDA_GRAPH = True   # the GPU parity protocol and graph predict == eager passed (docs/families.md)
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreDepthAnything3"   # the LibreYOLO checkpoint names: LibreDepthAnything3l-depth.pt
    DEFAULT_IMGSZ = 504
    STRIDE = PATCH
    PREPROCESS = Preprocess("cover", interpolation="bicubic", multiple=PATCH)

    SIGNATURE_KEYS = ("backbone.pretrained.pos_embed", "head.scratch.sky_output_conv2.2.weight")

    #: DA3 publishes no fine-tuning recipe: Depth Anything V2's (same encoder and head kind), see
    #: :attr:`DepthAnything.TRAIN_DEFAULTS`; from random weights V2's scratch rate
    TRAIN_DEFAULTS: dict[str, Any] = dict(DepthAnything.TRAIN_DEFAULTS)
    SCRATCH_LR0 = DepthAnything.SCRATCH_LR0

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return DepthAnything3Net(size)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """The inverse depth of the depth branch alone: the sky step (a quantile substituted for
        the sky) is inference post-processing, not part of what the loss fits."""
        return net(x, sky=False)
