"""SegFormer declarations (semantic segmentation) and its capturable inference stage."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, SegformerNet


class Segformer(Model):
    """SegFormer (Mix Transformer encoder + all-MLP decoder), sizes b0-b5, semantic segmentation.

    The network takes RGB in [0, 1] and applies the ImageNet mean / std itself, so the shared
    preprocessing only stretches the image to the square (as SegFormer's evaluation resize does)
    and normalizes nothing. :meth:`infer` returns class logits at the network's input size; the
    semantic task's stage turns them into a class map (argmax) and maps it back to each image.
    """

    FAMILY = "segformer"
    TASK = "semantic"
    DEFAULT_NC = 150   # ADE20K, the label set of the published checkpoints
    # Declared after the GPU parity protocol passed (predict stages fp32 and AMP, batch 1 and 8;
    # training: step-0 loss and buffers, the whole step, the 20-step curve equal to eager's under
    # cuDNN's deterministic kernels, the bilinear upsampling's backward made deterministic by
    # ops.interpolate): see docs/families.md, Semantic segmentation.
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    WHOLE_STEP_OPTIMIZERS = ("sgd", "adamw")   # the step-0 checks passed with both; AdamW is the recipe's
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreSegformer"   # the LibreYOLO checkpoint names: LibreSegformerb0.pt, ...
    DEFAULT_IMGSZ = 512
    STRIDE = 32
    #: letterboxed at the top-left (grey 114) with OpenCV's INTER_LINEAR, as LibreYOLO does; mean/std
    #: None: SegformerNet normalizes internally
    PREPROCESS = Preprocess("topleft", quantize=True)

    SIGNATURE_KEYS = ("encoder.stages.0.patch_embeddings.proj.weight", "decode_head.linear_fuse.weight",
                      "decode_head.classifier.weight")
    NC_KEY = "decode_head.classifier.weight"

    #: SegFormer's fine-tuning recipe (ImageNet-pretrained encoder): AdamW, lr 6e-5, weight decay
    #: 0.01, betas (0.9, 0.999), linear warm-up then poly(1.0) decay to 0 (= linear, lrf 0), total
    #: batch 16 (nbs), no bias warm-up boost (the YOLO warm-up starts biases at lr 0.1).
    TRAIN_DEFAULTS: dict[str, Any] = {
        "optimizer": "AdamW", "lr0": 6e-5, "lrf": 0.0, "momentum": 0.9, "weight_decay": 0.01,
        "warmup_epochs": 1.0, "warmup_bias_lr": 0.0, "nbs": 16, "cos_lr": False,
    }
    #: lr0 from random weights (the rest of the recipe unchanged): of 1e-4, 3e-4 and 1e-3 on the
    #: built-in shapes-seg set, 3e-4 brought the training loss lowest, 1e-3 collapsed to predicting
    #: the background; from scratch the network learns that set only slowly (docs/families.md)
    SCRATCH_LR0 = 3e-4

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return SegformerNet(size, nc)

    def train_defaults(self) -> dict[str, Any]:
        """The fine-tuning recipe for trained weights; the same with ``SCRATCH_LR0`` from random ones."""
        d = dict(self.TRAIN_DEFAULTS)
        if not self.trained:
            d["lr0"] = self.SCRATCH_LR0
        return d

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] -> float32 class logits (B, nc, S, S)."""
        return self.model(x).float()
