"""LingBot-Vision declarations (semantic segmentation): preprocessing, the predict stage's
upsampling, training on the upsampled logits."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.interpolate import resize_bilinear
from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, PATCH_SIZE, LingBotVisionNet


class LingBotVision(Model):
    """LingBot-Vision (Robbyant's DINOv3-style ViT/16 with 2-D RoPE and register tokens) with a
    1x1 dense head, sizes s / b / l / g, semantic segmentation.

    The network takes RGB in [0, 1] and normalizes it itself; the shared preprocessing stretches
    the image to the square (OpenCV's INTER_LINEAR on uint8), as the reference does. :meth:`infer`
    upsamples the 1/16 patch logits to the input size (bilinear, ``align_corners=False``); the
    semantic task's stage takes the argmax and maps it back to each image. Training is
    cross-entropy on those upsampled logits (the task's loss).
    """

    FAMILY = "lingbotvision"
    TASK = "semantic"
    DEFAULT_NC = 150   # ADE20K, the label set of the reference's checkpoints
    # Not declared: no GPU has run the parity protocol on this family (docs/families.md, PIDNet
    # and LingBot-Vision, gives the commands). The predict stage is written graph-safe.
    SUPPORTS_CUDA_GRAPH = True   # the GPU parity protocol and graph predict == eager passed (docs/families.md)
    SUPPORTS_CUDA_GRAPH_TRAIN = False
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreLingBotVision"   # LibreLingBotVisions.pt, ...
    DEFAULT_IMGSZ = 512
    STRIDE = PATCH_SIZE
    #: stretched to the square with OpenCV's INTER_LINEAR on uint8, as the reference does; mean/std
    #: None: LingBotVisionNet normalizes internally
    PREPROCESS = Preprocess("stretch", quantize=True)

    SIGNATURE_KEYS = ("backbone.rope_embed.periods", "backbone.storage_tokens", "predict.weight")
    NC_KEY = "predict.weight"

    #: the reference's recipe (the report's linear probe on a pretrained backbone): AdamW, lr 1e-3,
    #: weight decay 1e-4, cosine decay to 0, 1 warm-up epoch, no photometric augmentation, the
    #: backbone frozen
    TRAIN_DEFAULTS: dict[str, Any] = {
        "optimizer": "AdamW", "lr0": 1e-3, "lrf": 0.0, "weight_decay": 1e-4, "cos_lr": True, "warmup_epochs": 1.0,
        "warmup_bias_lr": 0.0, "color_jitter": 0.0, "freeze": "backbone",
    }

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return LingBotVisionNet(size, nc)

    def train_defaults(self) -> dict[str, Any]:
        """The linear probe for trained weights; from random weights a probe has nothing to probe:
        the whole network trains, with the same optimizer and lr0 (of 1e-4, 3e-4 and 1e-3 on a
        shapes-seg set, 1e-3 ended lowest in loss and highest in mIoU: docs/families.md)."""
        d = dict(self.TRAIN_DEFAULTS)
        if not self.trained:
            del d["freeze"]
        return d

    @staticmethod
    def _logits(out: dict[str, torch.Tensor], size) -> torch.Tensor:
        return resize_bilinear(out["semantic_logits"].float(), tuple(size))

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] -> float32 class logits (B, nc, S, S)."""
        return self._logits(self.model(x), x.shape[-2:])

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> torch.Tensor:
        return self._logits(net(x), x.shape[-2:])

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor) -> torch.Tensor:
        """The eval pass's patch logits (the network has no training-only outputs), upsampled."""
        return self._logits(out, x.shape[-2:])
