"""Instance-mask head shared by the DETR segmentation variants (D-FINE, EC).

:class:`MaskDecoder` fuses a feature pyramid into one stride-4 mask feature (keys ``lateral.<i>``
1x1 convs, ``bn.<i>`` GroupNorms, ``fusion_conv`` / ``fusion_norm``, ``up_conv`` / ``bn1``):
every level goes through its lateral conv + GroupNorm, is resized (bilinear) to the first
(finest) level and summed; a 3x3 conv + GroupNorm + ReLU fuses them, the result is upsampled 2x
(bilinear) and refined by a second 3x3 conv + GroupNorm + ReLU. :func:`query_masks` turns the
decoder queries into per-instance mask logits: ``<mask_head(q) / sqrt(dim), mask feature>``
(:func:`mask_embedding`, then :func:`query_masks`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class MaskDecoder(nn.Module):
    """Pyramid (finest level first, that level at stride s) -> (B, dim, 2H_s, 2W_s) mask feature."""

    def __init__(self, in_channels: Sequence[int], dim: int, groups: int = 32):
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, dim, 1, bias=False) for c in in_channels)
        self.bn = nn.ModuleList(nn.GroupNorm(groups, dim) for _ in in_channels)
        self.fusion_conv = nn.Conv2d(dim, dim, 3, padding=1, bias=False)
        self.fusion_norm = nn.GroupNorm(groups, dim)
        self.up_conv = nn.Conv2d(dim, dim, 3, padding=1, bias=False)
        self.bn1 = nn.GroupNorm(groups, dim)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(feats) != len(self.lateral):
            raise ValueError(f"MaskDecoder expects {len(self.lateral)} feature levels, got {len(feats)}")
        y = self.bn[0](self.lateral[0](feats[0]))
        size = y.shape[-2:]
        for lat, bn, f in zip(self.lateral[1:], self.bn[1:], feats[1:]):
            y = y + F.interpolate(bn(lat(f)), size=size, mode="bilinear", align_corners=False)
        y = F.relu(self.fusion_norm(self.fusion_conv(y)))
        y = F.interpolate(y, size=(size[0] * 2, size[1] * 2), mode="bilinear", align_corners=False)
        return F.relu(self.bn1(self.up_conv(y)))


def mask_embedding(mask_head: nn.Module, queries: torch.Tensor) -> torch.Tensor:
    """(B, Q, C) decoder queries -> (B, Q, D) mask embeddings, scaled by ``1/sqrt(D)``."""
    embed = mask_head(queries)
    return embed / math.sqrt(embed.shape[-1])


def query_masks(embed: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """(B, Q, D) mask embeddings x (B, D, H, W) mask feature -> (B, Q, H, W) mask logits."""
    return torch.einsum("bqc,bchw->bqhw", embed, feature)
