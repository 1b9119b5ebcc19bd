"""YOLO-NAS-R: the YOLO-NAS family's oriented-box variant (dense rotated DFL heads, rotated NMS)."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..rtdetrv2.obb import DOTA_NAMES
from .model import YoloNAS
from .obb_nn import YoloNASOBBNet

#: candidates kept (by score) before the obb task's rotated NMS; its greedy walk is one step per
#: candidate, so hundreds (the detection task's ``max_nms`` order), not the thousands of the dense grid
PRE_NMS_TOP_K = 300


def canonical_rboxes(rboxes: torch.Tensor) -> torch.Tensor:
    """(..., 5) cx, cy, w, h, angle -> the same rectangles with the longer side as the width and the
    angle in [0, pi) (fixed shapes, no host synchronisation)."""
    cx, cy, w, h, a = rboxes.unbind(-1)
    swap = h > w
    w2, h2 = torch.where(swap, h, w), torch.where(swap, w, h)
    a = torch.remainder(a + swap.to(a.dtype) * (math.pi / 2), math.pi)
    return torch.stack((cx, cy, w2, h2, a), -1)


class YoloNASOBB(YoloNAS):
    """YOLO-NAS-R (sizes s, m, l): the detector's backbone and neck with heads that predict, per
    anchor, class logits, width and height distributions (DFL), a rotation logit and a centre
    offset (:mod:`.obb_nn`). Built for ``task="obb"`` (``LibreYOLO.new("yolonas", "s", task="obb")``,
    ``yolonas-s-obb``) or from a checkpoint whose ``task`` is ``obb`` (or whose layout is this one).

    Preprocessing as the reference: BGR (channels reversed inside :meth:`infer`) in [0, 1], no
    normalization, the longer side resized to the input size (1024) at the top-left of the square,
    padded with 114. Predict: the network, the ``NUM_TOP`` best anchors by score, then the obb
    task's rotated NMS on the device. Training: YOLO-NAS-R's loss (:mod:`.obb_loss`), fixed-shape.
    """

    TASK = "obb"
    # predict's graph (rotated NMS included) passed the GPU parity protocol (docs/families.md); the
    # training step's rows have not run on a GPU yet (the loss is fixed-shape, reads nothing on the host)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True   # the GPU training rows passed (docs/families.md)
    NMS = True
    DEFAULT_NC = len(DOTA_NAMES)
    DEFAULT_IMGSZ = 1024
    PREPROCESS = Preprocess("topleft", quantize=True)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".yolonas.model:YoloNAS",
                                               "pose": ".yolonas.pose:YoloNASPose"}
    #: the stem's first 3x3 branch and the stride-8 head's rotation and offset convs
    SIGNATURE_KEYS = ("backbone.stem.conv.branch_3x3.conv.weight", "backbone.stem.conv.rbr_reparam.weight",
                      "heads.head1.rot_pred.weight", "heads.head1.offset_pred.weight")
    NC_KEY = "heads.head1.cls_pred.weight"
    NUM_TOP = PRE_NMS_TOP_K

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        return bool(cls.SIGNATURE_KEYS) and all(k in state_dict for k in cls.SIGNATURE_KEYS)

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        return dict(enumerate(DOTA_NAMES)) if nc == len(DOTA_NAMES) else {i: f"class{i}" for i in range(nc)}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.SIZES:
            raise ValueError(f"unknown YOLO-NAS size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return YoloNASOBBNet(size, nc)

    def build_loss(self) -> nn.Module:
        """YOLO-NAS-R's loss (:class:`.obb_loss.YoloNASOBBLoss`)."""
        from .obb_loss import YoloNASOBBLoss
        return YoloNASOBBLoss(self.nc)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """The network's outputs on the BGR input, with the input's (height, width) (the loss
        scales the normalized targets to pixels)."""
        return net(x.flip(1)), (int(x.shape[-2]), int(x.shape[-1]))

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        return out, (int(x.shape[-2]), int(x.shape[-1]))

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB canvas -> the ``NUM_TOP`` best anchors by score (fixed shapes): xywhr
        (B, K, 5) in canvas pixels (longer side first, angle in radians in [0, pi)), scores (B, K),
        classes (B, K), sorted by score; the obb task's rotated NMS picks among them."""
        (rboxes, scores), _ = self.model(x.flip(1))
        score, cls = scores.float().max(-1)
        k = min(self.NUM_TOP, score.shape[1])
        score, idx = score.topk(k, dim=1, sorted=True)
        rb = canonical_rboxes(rboxes.float().gather(1, idx[..., None].expand(-1, -1, 5)))
        return rb, score, cls.gather(1, idx)


__all__ = ["PRE_NMS_TOP_K", "YoloNASOBB", "canonical_rboxes"]
