"""FOMO declarations (point detection): sizes, preprocessing as data, the training recipe."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, STRIDE, FomoNet


class Fomo(Model):
    """FOMO (Edge Impulse's "Faster Objects, More Objects"; LibreYOLO 1.6.0's ``LibreFOMO``), sizes
    s / m / l, task ``point``: a MobileNetV2 cut at 1/8 of the input and a 1x1 head giving per
    cell the logits of background and of each class; the point task turns its peaks into object
    centres (:mod:`libreyolo.tasks.point`).

    Preprocessing as data, the reference's: the image stretched to the square input (PIL's
    bilinear resize of uint8 pixels: antialiased when it shrinks, whole levels), scaled to
    [-1, 1] (mean = std = 0.5). Each size has its native input (s 96, m 192, l 224: ``imgsz``'s
    default); other sizes must be multiples of 8, where the network's TensorFlow-style padding
    equals the reference's.

    Checkpoints: ``LibreFOMOs-point.pt`` and the like (the ``-point`` suffix names the task),
    metadata ``model_family: fomo``, ``task: point``; the head's first dimension is ``1 + nc``.
    """

    FAMILY = "fomo"
    TASK = "point"
    DEFAULT_NC = 1
    # predict and the whole training step proven on a GPU: docs/families.md (session 31's rows)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreFOMO"
    DEFAULT_IMGSZ = CONFIGS["s"].imgsz
    DEFAULT_IMGSZ_BY_SIZE = {size: cfg.imgsz for size, cfg in CONFIGS.items()}
    STRIDE = STRIDE
    PREPROCESS = Preprocess("stretch", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), antialias=True, quantize=True)

    SIGNATURE_KEYS = ("backbone.block_6_expand.0.conv.weight", "backbone.expanded_conv.conv.0.0.conv.weight",
                      "head.weight")
    NC_KEY = "head.weight"
    NC_EXTRA_CHANNELS = 1   # the background channel
    #: the loss's weight of an object cell against a background cell (Edge Impulse's FOMO: 100)
    FG_WEIGHT = 100.0

    #: FOMO's recipe (Edge Impulse): Adam at lr 0.001 without warm-up; here AdamW (no weight decay
    #: of BatchNorm or biases), a linear decay to lr / 100, one optimizer step per batch of 32
    TRAIN_DEFAULTS: dict[str, Any] = {
        "optimizer": "AdamW", "lr0": 1e-3, "lrf": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "nbs": 32,
        "warmup_epochs": 0.0, "warmup_bias_lr": 0.0, "batch": 32,
    }

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return FomoNet(size, nc)

    def train_defaults(self) -> dict[str, Any]:
        """The recipe at the model's own input size (each size trains at its native one)."""
        return {**self.TRAIN_DEFAULTS, "imgsz": self.imgsz}

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [-1, 1] -> float32 centroid-map logits (B, 1 + nc, S/8, S/8)."""
        return self.model(x).float()
