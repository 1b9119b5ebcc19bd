"""PicoDet declarations and its capturable inference stage."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.boxes import clip_to_canvas, distance_to_xyxy
from ...ops.preprocess import Preprocess
from ..base import Model
from ..common.assign import cached, join_levels, level_priors
from .nn import CONFIGS, REG_MAX, STRIDES, PicodetNet

#: decode's prior points, strides and bins per input size (all levels joined: ~12 kernels per call, not ~60)
_PRIORS: dict = {}

# ImageNet statistics on the 0-255 scale, RGB order (the original checkpoints' input).
RGB_MEAN = (123.675, 116.28, 103.53)
RGB_STD = (58.395, 57.12, 57.375)
# Input size each size was trained at (the LibreYOLO checkpoints' ``imgsz``).
INPUT_SIZES = {"s": 320, "m": 416, "l": 640}


class Picodet(Model):
    """PicoDet detector (ESNet + CSP-PAN + GFL head, 4 levels), sizes s, m, l.

    The original pipeline plain-resizes the image to a square (no letterbox); here the
    shared top-left letterbox (grey 114) is used, which keeps the aspect ratio.
    """

    FAMILY = "picodet"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibrePICODET"
    # Inputs need only be multiples of 32 (the stride-64 level is a padded stride-2 conv,
    # e.g. 416 -> 7x7), so the trained size 416 of size m is kept as is.
    STRIDE = 32
    DEFAULT_IMGSZ = 320
    #: LibreYOLO and the original pipeline resize to the square (no letterbox) with OpenCV's INTER_LINEAR
    PREPROCESS = Preprocess("stretch", quantize=True)
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # Declared after the GPU training parity passed (step-0 loss and BatchNorm buffers bitwise, 20-step
    # curves within eager noise; forward+backward and whole step): see docs/families.md.
    SUPPORTS_CUDA_GRAPH_TRAIN = True

    def __init__(self, net: nn.Module, *, size: str, imgsz: int | None = None, **kwargs: Any):
        super().__init__(net, size=size, imgsz=imgsz or INPUT_SIZES.get(size), **kwargs)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return PicodetNet(size, nc)

    SIGNATURE_KEYS = ("head.gfl_cls.0.weight", "neck.trans.0.conv.weight",
                      "backbone.blocks.0.conv_dw_mv1.conv.weight")
    NC_KEY = "head.gfl_cls.0.weight"
    NC_EXTRA_CHANNELS = 4 * (REG_MAX + 1)

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """Class channels (the first ``nc`` of each gfl_cls conv) to the prior; box bins untouched."""
        return self._prior_bias(net, (("head.gfl_cls.", 0, self.nc),), prior)

    @staticmethod
    def normalize(x: torch.Tensor) -> torch.Tensor:
        """RGB in [0, 1] -> ImageNet-normalized RGB on the 0-255 scale (no host copies)."""
        return torch.stack([(x[:, i] * 255.0 - RGB_MEAN[i]) / RGB_STD[i] for i in range(3)], 1)

    def build_loss(self) -> nn.Module:
        """SimOTA, VFL, GIoU and DFL (PaddleDetection's PicoDet recipe for this head)."""
        from .loss import PicodetLoss
        return PicodetLoss(self.nc)

    def train_forward(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
        """The network sees the same ImageNet-normalized input in training as in ``infer``."""
        return net(self.normalize(x))

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, H, W) RGB in [0, 1] -> boxes (B, N, 4) xyxy canvas pixels, score (B, N), class (B, N)."""
        cls_maps, box_maps = self.model(self.normalize(x))
        b = x.shape[0]
        d = join_levels(box_maps).float()                                  # (B, N, 4*(R+1))
        hw = [m.shape[-2:] for m in box_maps]
        pts, strides = level_priors(_PRIORS, hw, STRIDES, 0.5, True, d.dtype, d.device)
        bins, = cached(_PRIORS, ("bins", d.device), lambda: (torch.arange(REG_MAX + 1, device=d.device,
                                                                         dtype=torch.float32),))
        # (B, N, 4, R+1): expectation of the softmax over the bins, in pixels
        dist = (d.reshape(b, -1, 4, REG_MAX + 1).softmax(-1) * bins).sum(-1) * strides
        box = clip_to_canvas(distance_to_xyxy(pts, dist), x.shape[-2], x.shape[-1])
        scores, cls = join_levels(cls_maps).float().sigmoid().max(-1)
        return box, scores, cls
