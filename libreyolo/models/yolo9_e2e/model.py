"""YOLOv9-E2E declarations and its NMS-free inference stage."""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ..base import train_format
from ..yolo9.model import Yolo9
from .nn import CONFIGS, Yolo9E2ENet


def one2one_topk(pred: torch.Tensor, num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """YOLOv10's post-processing of decoded predictions (B, 4+nc, N): the ``K = min(num_top, N)``
    anchors of highest best-class score, then the K best (anchor, class) pairs among them.
    Returns boxes (B, K, 4), scores (B, K) sorted descending and classes (B, K) int64; fixed
    shapes, nothing read on the host."""
    pred = pred.transpose(1, 2)                                   # (B, N, 4+nc)
    boxes, scores = pred[..., :4], pred[..., 4:]
    nc = scores.shape[-1]
    k = min(int(num_top), pred.shape[1])
    _, anchor = scores.amax(-1).topk(k, dim=1)                    # (B, K)
    boxes = boxes.gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))
    scores = scores.gather(1, anchor.unsqueeze(-1).expand(-1, -1, nc))
    top, index = scores.flatten(1).topk(k, dim=1)                 # (B, K) over K * nc pairs
    picked = boxes.gather(1, (index // nc).unsqueeze(-1).expand(-1, -1, 4))
    return picked, top, index % nc


class Yolo9E2E(Yolo9):
    """YOLOv9-E2E (GELAN with a one-to-one head, no NMS), sizes t, s, m, c."""

    FAMILY = "yolo9_e2e"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreYOLO9E2E"
    # predict's graph passed the GPU parity protocol; training capture: step 0 bitwise, and the
    # 20-step curves under cuDNN's deterministic kernels (docs/families.md)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    #: NMS-free: the predictor applies only the confidence threshold and max_det
    NMS = False
    #: how many (anchor, class) pairs :meth:`infer` returns per image (YOLOv10's max_det)
    NUM_TOP: ClassVar[int] = 300

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return Yolo9E2ENet(size, nc)

    SIGNATURE_KEYS = ("backbone.elan1.cv1.conv.weight", "neck.elan_down2.cv4.conv.weight",
                      "head.one2one_cv3.0.2.weight")
    NC_KEY = "head.cv3.0.2.weight"
    VARIANT_KEYS = ()

    def build_loss(self) -> nn.Module:
        from .loss import Yolo9E2ELoss
        return Yolo9E2ELoss(self.nc)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) -> boxes (B, K, 4) xyxy canvas pixels, scores (B, K), classes (B, K),
        sorted by score: the one-to-one head's top-K (:func:`one2one_topk`), no NMS."""
        return one2one_topk(self.model(x)["predictions"].float(), self.NUM_TOP)

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        """The eval pass runs the one-to-one branch only: a second pass in training format (both
        heads), normalization layers in eval mode."""
        with train_format(net):
            return net(x)
