"""ECViT: the compact ViT backbone of EdgeCrafter's ECDet, in the LibreYOLO checkpoint layout.

Layout (attribute names are checkpoint keys): ``backbone.register_token`` (one extra token
prepended to the patches), ``backbone.patch_embed`` (a pyramid of three stride-2 Conv-BN-ReLU
layers ``convs.*`` and a stride-2 3x3 ``proj`` conv: patch size 16), ``backbone.blocks.*``
(pre-norm transformer blocks: LayerNorm eps 1e-6, fused ``attn.qkv``, GELU MLP ``fc1``/``fc2``),
``backbone.rope_embed.periods`` (the 2-D rotary embedding's periods, a persistent buffer), then
``projector.*`` (Conv-BN, no activation).

The adapter averages the patch tokens of the last two blocks, reshapes them to the 1/16 grid
and resamples that map bilinearly to strides 8, 16 and 32. With a single projector (sizes s, m)
only the stride-32 map is projected; with three (l, x) each level has its own.

Every shape follows from the input shape alone, so the forward pass can be captured in a
CUDA graph.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..detr_common.layers import ConvNorm

PATCH = 16


class RopeEmbedding2d(nn.Module):
    """2-D rotary position embedding (DINOv3 style) with coordinates normalised per axis.

    Each head dimension is split into (y, x) halves of ``head_dim // 4`` frequencies each; the
    coordinates are patch centres mapped to [-1, 1]. ``periods`` is stored in checkpoints.
    """

    def __init__(self, embed_dim: int, num_heads: int, base: float = 100.0):
        super().__init__()
        head_dim = embed_dim // num_heads
        if head_dim % 4:
            raise ValueError(f"2-D RoPE needs a head dimension divisible by 4, got {head_dim}")
        n = head_dim // 4
        self.register_buffer("periods", base ** (2 * torch.arange(n, dtype=torch.float32) / (head_dim // 2)))

    def forward(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sin, cos), each (1, 1, h*w, head_dim), for an h x w patch grid (row-major)."""
        periods = self.periods.float()
        ys = (torch.arange(h, device=periods.device, dtype=periods.dtype) + 0.5) / h
        xs = (torch.arange(w, device=periods.device, dtype=periods.dtype) + 0.5) / w
        coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), -1).flatten(0, 1) * 2.0 - 1.0
        angles = (2 * math.pi) * coords[:, :, None] / periods[None, None, :]   # (hw, 2, n)
        angles = angles.flatten(1, 2).repeat(1, 2)                              # (hw, 4n)
        return angles.sin()[None, None], angles.cos()[None, None]


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rotated * sin


class ViTAttention(nn.Module):
    """Multi-head self-attention; RoPE on every token but the first (the register token)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        sin, cos = (t.to(q.dtype) for t in rope)
        q = torch.cat((q[:, :, :1], _rotate(q[:, :, 1:], sin, cos)), 2)
        k = torch.cat((k[:, :, :1], _rotate(k[:, :, 1:], sin, cos)), 2)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class ViTMlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(nn.Module):
    """Pre-norm transformer block (LayerNorm eps 1e-6)."""

    def __init__(self, dim: int, num_heads: int, ffn_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ViTAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ViTMlp(dim, int(dim * ffn_ratio))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class ConvPyramidPatchEmbed(nn.Module):
    """Patch size 16 as four stride-2 3x3 convs: three Conv-BN-ReLU (dim/8, /4, /2) + a biased conv."""

    def __init__(self, embed_dim: int):
        super().__init__()
        chans = [embed_dim // 8, embed_dim // 4, embed_dim // 2]
        self.convs = nn.ModuleList(ConvNorm(c_in, c_out, 3, 2, act="relu")
                                   for c_in, c_out in zip([3] + chans[:-1], chans))
        self.proj = nn.Conv2d(chans[-1], embed_dim, 3, 2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x)
        return self.proj(x)


class ECViT(nn.Module):
    """The ViT trunk: returns the patch tokens (register token dropped) of ``return_layers``."""

    def __init__(self, embed_dim: int, num_heads: int, depth: int = 12, ffn_ratio: float = 4.0,
                 return_layers: tuple[int, ...] = (10, 11)):
        super().__init__()
        self.return_layers = tuple(return_layers)
        self.register_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.patch_embed = ConvPyramidPatchEmbed(embed_dim)
        self.blocks = nn.ModuleList(ViTBlock(embed_dim, num_heads, ffn_ratio) for _ in range(depth))
        self.rope_embed = RopeEmbedding2d(embed_dim, num_heads)
        nn.init.trunc_normal_(self.register_token, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], int, int]:
        tokens = self.patch_embed(x)
        h, w = tokens.shape[-2:]
        tokens = tokens.flatten(2).transpose(1, 2)
        x = torch.cat((self.register_token.expand(tokens.shape[0], -1, -1), tokens), 1)
        rope = self.rope_embed(h, w)
        outs = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, rope)
            if i in self.return_layers:
                outs.append(x[:, 1:])
        return outs, h, w


class ECBackbone(nn.Module):
    """ECViT + the adapter that turns its 1/16 tokens into a stride 8/16/32 pyramid."""

    def __init__(self, embed_dim: int, num_heads: int, proj_dim: int | None = None, ffn_ratio: float = 4.0):
        super().__init__()
        self.backbone = ECViT(embed_dim, num_heads, ffn_ratio=ffn_ratio)
        dims = [proj_dim] * 3 if proj_dim is not None else [embed_dim]
        self.projector = nn.ModuleList(ConvNorm(embed_dim, d, 1, 1) for d in dims)
        self.out_channels = [proj_dim or embed_dim] * 3

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs, h, w = self.backbone(x)
        fused = torch.stack(outs).mean(0).transpose(1, 2).reshape(x.shape[0], -1, h, w)
        # the stride-16 level is the map itself (a same-size bilinear resample is the identity)
        feats = [F.interpolate(fused, size=(h * 2, w * 2), mode="bilinear", align_corners=False), fused,
                 F.interpolate(fused, size=(h // 2, w // 2), mode="bilinear", align_corners=False)]
        if len(self.projector) == 1:
            feats[-1] = self.projector[0](feats[-1])
        else:
            feats = [proj(f) for proj, f in zip(self.projector, feats)]
        return feats
