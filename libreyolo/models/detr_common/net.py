"""The backbone -> encoder -> decoder container shared by the DETR families."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .layers import fuse_detr


class DetrNet(nn.Module):
    """``decoder(encoder(backbone(x)), targets)``; checkpoint prefixes ``backbone``, ``encoder``,
    ``decoder``.

    Eval mode returns ``{"pred_logits", "pred_boxes"}``. ``targets`` (training only: ``{"labels"
    (B, M) long, "boxes" (B, M, 4) normalised cxcywh, "mask" (B, M) bool}``, optionally
    ``"pad_to"``; see :mod:`.denoising`) is passed through to the decoder for query denoising.
    """

    def __init__(self, backbone: nn.Module, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, x: torch.Tensor, targets: Any = None) -> dict[str, Any]:
        front = self.__dict__.get("front_override")   # a graphed backbone+encoder while training
        feats = front(x) if front is not None else self.encoder(self.backbone(x))
        return self.decoder(feats, targets)

    def fuse(self) -> DetrNet:
        """Fold BatchNorms into convolutions and merge RepVGG branches (inference only)."""
        fuse_detr(self)
        return self


class DetrFront(nn.Module):
    """``encoder(backbone(x))`` of a :class:`DetrNet`, as one module (the training seam).

    It holds the net's own backbone and encoder (the same parameters); it is never attached to
    the net, so checkpoints are unchanged.
    """

    def __init__(self, net: DetrNet):
        super().__init__()
        self.backbone = net.backbone
        self.encoder = net.encoder

    def forward(self, x: torch.Tensor):
        return self.encoder(self.backbone(x))
