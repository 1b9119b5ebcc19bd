"""ECSeg network: ECDet with EdgeCrafter's instance-mask head (after RF-DETR's segmentation head).

The detector is unchanged (:class:`.nn.ECNet`); its decoder also returns the evaluated layer's
queries, and :class:`ECSegHead` (checkpoint prefix ``decoder.decoder.segmentation_head``, after the
decoder layers' LQE heads) turns them into per-query mask logits:

* spatial side: the encoder's finest map (stride 8) is resized bilinearly to a FIXED grid of
  ``mask_size`` = (native input / 4)^2 = 160 x 160 cells, whatever the input size, so the grid
  always spans the whole input; then depthwise-conv blocks (:class:`DepthwiseConvBlock`: 3x3
  depthwise conv, channels-last LayerNorm, Linear, GELU, residual) and a 1x1 projection
  (``spatial_features_proj``);
* query side: an MLP block (:class:`MLPBlock`: LayerNorm, Linear to 4x, GELU, Linear back,
  residual) and a Linear projection (``query_features_proj``);
* mask logits = <query feature, spatial feature> + a learned scalar ``bias``.

The head holds one block per decoder layer. The original applies them in sequence, one more per
layer whose mask it makes: in eval only the evaluated (last) layer's queries are passed, so only
the first block runs; in training every layer's queries are, so the last layer's mask has passed
through every block. This network does the same for the masks it returns.

Eval output: the detector's ``{"pred_logits", "pred_boxes"}`` plus ``"pred_masks"`` (B, Q, 160, 160)
mask LOGITS (no sigmoid; threshold 0). ``with_mask_parts=True`` returns the factors instead
(``"mask_embed"`` (B, Q, D) and ``"mask_feature"`` (B, D, 160, 160), whose dot product plus the
bias is the logits), so predict builds only the kept instances' masks. Training mode returns the
detector's training dict with ``"pred_masks"`` of the last layer's matching queries; the earlier
layers' masks (the original's auxiliary mask terms) would need every layer's queries, which the
shared decoder does not return.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .nn import INPUT_SIZE, ECConfig, ECNet

#: the mask grid's side: the native input size over the head's downsampling ratio (4)
MASK_SIZE = INPUT_SIZE // 4


class DepthwiseConvBlock(nn.Module):
    """3x3 depthwise conv -> LayerNorm over channels (eps 1e-6) -> Linear -> GELU, plus the input."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.act(self.pwconv1(self.norm(y)))
        return y.permute(0, 3, 1, 2) + x


class MLPBlock(nn.Module):
    """LayerNorm -> Linear (4x) -> GELU -> Linear, plus the input (keys ``norm_in``, ``layers.{0,2}``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm_in = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm_in(x)
        for layer in self.layers:
            y = layer(y)
        return y + x


class ECSegHead(nn.Module):
    """Per-query mask logits on a fixed ``mask_size`` grid (see the module docstring)."""

    def __init__(self, dim: int, num_blocks: int, mask_size: int = MASK_SIZE):
        super().__init__()
        self.mask_size = int(mask_size)
        self.bias = nn.Parameter(torch.zeros(1))
        self.blocks = nn.ModuleList(DepthwiseConvBlock(dim) for _ in range(num_blocks))
        self.spatial_features_proj = nn.Conv2d(dim, dim, kernel_size=1)
        self.query_features_block = MLPBlock(dim)
        self.query_features_proj = nn.Linear(dim, dim)

    def spatial(self, feature: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """(B, C, h, w) finest encoder map -> (B, D, S, S) projected mask feature after the first
        ``depth`` blocks (S = ``mask_size``)."""
        if not 1 <= depth <= len(self.blocks):
            raise ValueError(f"depth must be in [1, {len(self.blocks)}], got {depth}")
        y = F.interpolate(feature, size=(self.mask_size, self.mask_size), mode="bilinear", align_corners=False)
        for block in self.blocks[:depth]:
            y = block(y)
        return self.spatial_features_proj(y)

    def embed(self, queries: torch.Tensor) -> torch.Tensor:
        """(B, Q, C) decoder queries -> (B, Q, D) mask embeddings."""
        return self.query_features_proj(self.query_features_block(queries))

    def logits(self, embed: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """(B, Q, D) embeddings x (B, D, S, S) feature -> (B, Q, S, S) mask logits."""
        return torch.einsum("bqc,bchw->bqhw", embed, feature) + self.bias.to(feature.dtype)


class ECSegNet(ECNet):
    """ECDet + :class:`ECSegHead` (``decoder.decoder.segmentation_head.*``); ``forward(x, targets=None,
    with_mask_parts=False)`` -> dict (see the module docstring)."""

    def __init__(self, cfg: ECConfig, nc: int = 80, mask_size: int = MASK_SIZE):
        super().__init__(cfg, nc)
        self.decoder.return_queries = True
        stack = self.decoder.decoder
        stack.segmentation_head = ECSegHead(cfg.hidden_dim, len(stack.layers), mask_size)

    @property
    def mask_head(self) -> ECSegHead:
        return self.decoder.decoder.segmentation_head

    def forward(self, x: torch.Tensor, targets: Any = None, with_mask_parts: bool = False) -> dict[str, Any]:
        front = self.__dict__.get("front_override")   # DetrNet's training seam, when one is set
        feats = front(x) if front is not None else self.encoder(self.backbone(x))
        out = self.decoder(feats, targets)
        head = self.mask_head
        embed = head.embed(out.pop("queries"))
        feature = head.spatial(feats[0], len(head.blocks) if self.training else 1)
        if with_mask_parts:
            out["mask_embed"], out["mask_feature"] = embed, feature
            return out
        out["pred_masks"] = head.logits(embed, feature)
        return out
