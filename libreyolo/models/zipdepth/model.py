"""ZipDepth declarations (lightweight monocular relative depth) and its fused predict network."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..depth_anything.model import DepthFamily
from .nn import CONFIGS, ZipDepthNet
from .nn import STRIDE as NET_STRIDE


class ZipDepth(DepthFamily):
    """ZipDepth (Tosi et al.; a 6.8 M-parameter re-parameterizable CNN distilled from Depth
    Anything V2 Large), size b (upstream's "base"), task ``depth``: the speed tier of the task.

    Preprocessing as data, ZipDepth's own inference resize: the aspect ratio kept, the shorter
    side to ``imgsz`` (384 by default, LibreYOLO's), each side rounded to a multiple of 32,
    OpenCV's INTER_LINEAR on uint8 pixels (so the resized pixels are whole levels); the network
    normalizes with its ``mean`` / ``std`` buffers itself. :meth:`infer` returns the relative
    inverse depth (B, 1, H', W'), which the depth task maps back to the image.

    Checkpoints hold the multi-branch (training) weights. Predict runs the fused network
    (:meth:`ZipDepthNet.fuse`: each RepVGG block one 3x3 conv, BatchNorms folded), a copy kept
    beside the model's own network, which stays in the checkpoint layout (``save()``, training
    and validation use it). The fused network equals the multi-branch one up to float32
    rounding (docs/families.md); ``predict_fused = False`` runs the loaded network.
    """

    FAMILY = "zipdepth"
    SUPPORTS_CUDA_GRAPH = True   # proven on the GPU (docs/families.md, "Depth estimation")
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreZipDepth"   # the LibreYOLO checkpoint names: LibreZipDepthb-depth.pt
    DEFAULT_IMGSZ = 384
    STRIDE = NET_STRIDE
    PREPROCESS = Preprocess("cover", multiple=NET_STRIDE, quantize=True)

    SIGNATURE_KEYS = ("encoder.stem_half.conv.weight", "encoder.cross_scale.low_to_high.weight",
                      "decoder.convex_up.mask_pred.3.weight")

    #: ZipDepth's training recipe (scripts/train.py upstream): AdamW, lr 5e-4, weight decay 0.01, a
    #: one-cycle schedule (warm-up from lr / 25, cosine decay to lr / 25,000: lrf 4e-5). Not
    #: reproduced: its 5 % warm-up of all steps (one epoch here) and its gradient-matching loss
    #: term (the depth task's loss is the scale-and-shift-invariant one alone).
    TRAIN_DEFAULTS: dict[str, Any] = {
        "optimizer": "AdamW", "lr0": 5e-4, "lrf": 4e-5, "momentum": 0.9, "weight_decay": 0.01,
        "warmup_epochs": 1.0, "warmup_bias_lr": 0.0, "cos_lr": True,
    }

    #: predict (and bench) run the re-parameterized copy (see the class docstring)
    predict_fused: bool = True

    def __init__(self, net: nn.Module, **kwargs: Any):
        self._fused_copy: tuple | None = None   # (source network, its fingerprint, fused copy)
        super().__init__(net, **kwargs)

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return ZipDepthNet(size)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        if net.training and x.shape[0] < 2:   # torch's own error would name a 1x1 BatchNorm input
            raise ValueError("ZipDepth trains on batches of at least 2 images: its global-context block "
                             "normalizes one pooled value per channel and image (BatchNorm needs two); "
                             f"got a batch of {x.shape[0]} (raise batch, or use more training images)")
        return net(x)

    # ------------------------------------------------------------------ the fused network
    def get_predictor(self):
        self._refresh_fused()
        return super().get_predictor()

    def _refresh_fused(self) -> None:
        """(Re)build the fused copy when predict should use one and the network changed since
        (weights loaded, moved, re-drawn): outside any capture, before a predict starts."""
        if self.fused or not self.predict_fused or self.model.training:
            self._fused_copy = None
            return
        fp = self.runner.fingerprint()
        c = self._fused_copy
        if c is None or c[0] is not self.model or c[1] != fp:
            self._fused_copy = (self.model, fp, copy.deepcopy(self.model).fuse().eval())

    def _net(self) -> nn.Module:
        """The network :meth:`infer` runs: the fused copy while it is current, else the model's
        own (a twin from :meth:`infer_with`, a network changed since the copy was made)."""
        c = self._fused_copy
        if c is not None and c[0] is self.model and self.predict_fused and not self.fused \
                and c[1] == self.runner.fingerprint():
            return c[2]
        return self.model

    def _attach(self, net: nn.Module) -> None:
        super()._attach(net)
        self._fused_copy = None

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) RGB in [0, 1] -> float32 relative inverse depth (B, 1, H, W), >= 0."""
        return self._net()(x).float()
