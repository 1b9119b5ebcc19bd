"""PP-YOLOE declarations and its capturable inference stage."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..base import Model
from .nn import CONFIGS, PPYoloENet


class PPYoloE(Model):
    """PP-YOLOE (CSPResNet + CustomCSPPAN + ET-head, anchor-free, 3 levels), sizes s, m, l, x."""

    FAMILY = "ppyoloe"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibrePPYOLOE"
    #: the released weights' input: RGB stretched to the square (no letterbox) with OpenCV's
    #: INTER_LINEAR on uint8 pixels, then ImageNet mean/std (123.675, ... / 58.395, ... on 0-255)
    PREPROCESS = Preprocess("stretch", mean=IMAGENET_MEAN, std=IMAGENET_STD, quantize=True)
    # predict's graph passed the GPU parity protocol; training capture: step 0 bitwise, and the
    # 20-step curves under cuDNN's deterministic kernels (docs/families.md)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return PPYoloENet(size, nc)

    SIGNATURE_KEYS = ("backbone.stem.conv1.seq.conv.weight", "neck.fpn_stages.0.0.conv1.seq.conv.weight",
                      "head.pred_cls.0.weight")
    NC_KEY = "head.pred_cls.0.weight"

    def build_loss(self) -> nn.Module:
        """Task-aligned assignment, VFL, GIoU and DFL (PaddleDetection's PP-YOLOE recipe)."""
        from .loss import PPYoloELoss
        return PPYoloELoss(self.nc)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) normalized input -> boxes (B, N, 4) xyxy canvas pixels, best score (B, N),
        class (B, N)."""
        (boxes, scores), _ = self.model(x)
        scores, cls = scores.float().max(-1)
        return boxes.float(), scores, cls

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        """The eval pass already holds the training-format tuple (``out[1]``): no second pass."""
        return out[1]
