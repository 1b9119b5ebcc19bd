"""Depth Anything V2 declarations (monocular relative depth) and its capturable inference stage."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, PATCH, DepthAnythingNet


class DepthFamily(Model):
    """What the depth families share (Depth Anything V2, Depth Anything 3, ZipDepth): one output
    channel named ``depth``, :meth:`infer` = the network's float32 map, and the training recipe
    plumbing - ``TRAIN_DEFAULTS`` for trained weights, ``SCRATCH_LR0`` (when set) from random ones,
    and a nominal batch equal to the batch (the task's loss is a per-image mean)."""

    TASK = "depth"
    #: lr0 from random weights (None: the recipe's own)
    SCRATCH_LR0: float | None = None

    def __init__(self, net: nn.Module, *, nc: int = 1, names: Any = None, **kwargs: Any):
        # one output channel, whatever a caller's generic default (nc=80) says
        super().__init__(net, nc=1, names=names if names is not None else {0: "depth"}, **kwargs)

    @classmethod
    def nc_from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> int | None:
        return 1

    def train_defaults(self) -> dict[str, Any]:
        """The recipe for trained weights, ``SCRATCH_LR0`` from random ones; at this model's input
        size and with the nominal batch equal to the batch (set in :meth:`train`)."""
        d = {**self.TRAIN_DEFAULTS, "imgsz": self.imgsz}
        if not self.trained and self.SCRATCH_LR0 is not None:
            d["lr0"] = self.SCRATCH_LR0
        return d

    def train(self, **kwargs: Any) -> dict:
        """Train as :meth:`Model.train`; ``nbs`` defaults to ``batch`` (the loss is a per-image mean)."""
        if kwargs.get("nbs") is None:
            from ...engine.config import RunConfig
            batch = kwargs.get("batch")
            kwargs["nbs"] = int(batch if batch is not None else RunConfig.batch)
        return super().train(**kwargs)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] -> float32 relative inverse depth (B, 1, S, S), >= 0."""
        return self.model(x).float()


class DepthAnything(DepthFamily):
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
    SUPPORTS_CUDA_GRAPH = True   # GPU parity: DEPTH_GRAPH_MODELS in tests/gpu/test_tasks_gpu.py (docs/families.md)
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreDepthAnythingV2"   # the LibreYOLO checkpoint names: LibreDepthAnythingV2s.pt, ...
    DEFAULT_IMGSZ = 518
    STRIDE = PATCH
    #: Depth Anything's own resize (LibreYOLO's too): the aspect ratio kept, the shorter side to
    #: imgsz, both sides to a multiple of 14, OpenCV's bicubic on float pixels (no antialiasing, no
    #: rounding); mean/std None: DepthAnythingNet normalizes internally
    PREPROCESS = Preprocess("cover", interpolation="bicubic", multiple=14)

    SIGNATURE_KEYS = ("pretrained.pos_embed", "pretrained.mask_token", "depth_head.scratch.output_conv2.2.weight")

    #: Depth Anything V2's fine-tuning recipe (trained weights): AdamW, lr 5e-6, weight decay 0.01,
    #: a linear warm-up then decay to 0 (its poly schedule, power 0.9, approximated by the linear
    #: one), no bias warm-up boost. Not reproduced: its 10x rate for the decoder (the trainer has
    #: one rate per parameter kind, not per module). The loss is a per-image mean, so the nominal
    #: batch is the batch (no accumulation).
    TRAIN_DEFAULTS: dict[str, Any] = {
        "optimizer": "AdamW", "lr0": 5e-6, "lrf": 0.0, "momentum": 0.9, "weight_decay": 0.01,
        "warmup_epochs": 1.0, "warmup_bias_lr": 0.0, "cos_lr": False,
    }
    #: lr0 from random weights (the rest of the recipe unchanged); see docs/families.md
    SCRATCH_LR0 = 3e-4

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return DepthAnythingNet(size)

    #: the bias the last 1x1 conv starts with when training from random weights (see below)
    OUTPUT_BIAS = 1.0

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """Before training an UNTRAINED network: the last conv's bias to ``OUTPUT_BIAS``. Two ReLUs
        close the head, and from a random initialisation its output is often 0 everywhere, so that
        no gradient reaches the network (and the scale-and-shift-invariant loss, which ignores a
        constant map, could not move it anyway); a positive bias keeps the first maps in the ReLU's
        linear part. Trained weights are never modified. Returns how many convs were touched."""
        conv = net.depth_head.scratch.output_conv2[2]
        with torch.no_grad():
            conv.bias.fill_(self.OUTPUT_BIAS)
        return 1

