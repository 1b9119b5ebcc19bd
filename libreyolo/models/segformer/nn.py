"""SegFormer semantic-segmentation network (Mix Transformer encoder + all-MLP decoder).

Layout follows the LibreYOLO checkpoints: ``encoder.stages.N`` holds ``patch_embeddings``
(``proj`` conv + ``layer_norm``), ``blocks.M`` (``layernorm_before``, ``attention`` with
``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` and, where the reduction ratio is above 1,
``sequence_reduction``; ``layernorm_after``; ``mlp`` with ``fc1`` / ``dwconv.dwconv`` / ``fc2``)
and a closing ``layer_norm``; ``decode_head`` holds ``linear_projections.N.proj``,
``linear_fuse`` (1x1 conv, no bias), ``batch_norm`` and ``classifier``. Size b0 is pinned by
the architecture fixture; b1-b5 use the widths and depths of the SegFormer paper.

Encoder (per stage i): an overlapping patch embedding (7x7 stride 4 for the first stage,
3x3 stride 2 after, padding k // 2) then blocks of pre-norm efficient self-attention and
Mix-FFN, each with a residual. The attention shortens the key/value sequence by a strided
``r x r`` conv plus LayerNorm (r = 8, 4, 2, 1 per stage); the Mix-FFN is
``fc1 -> 3x3 depthwise conv -> GELU (exact) -> fc2`` with hidden width 4x. Every LayerNorm
uses PyTorch's default eps 1e-5, and each stage ends with its own LayerNorm before the
tokens are folded back into a (B, C, H, W) map.

Decoder: each stage map is projected to ``decoder_dim`` channels by a linear layer,
upsampled bilinearly (align_corners=False) to the first stage's 1/4 resolution, and the four
maps are concatenated deepest stage first (stage 3, 2, 1, 0); then 1x1 conv -> BatchNorm ->
ReLU -> dropout -> 1x1 classifier. ``forward`` upsamples those 1/4-resolution logits to the
input size. Every upsampling goes through ``ops.interpolate.resize_bilinear``: the same forward
as ``F.interpolate``, and a backward that is deterministic (torch's sums with atomics).

Input: RGB in [0, 1]; the network normalizes it with the ImageNet mean / std held in
non-persistent buffers (so they are not part of the checkpoint layout). All shapes derive
from the input's static size: no host syncs and no data-dependent shapes (CUDA-graph safe).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.interpolate import resize_bilinear

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

NUM_HEADS = (1, 2, 5, 8)
SR_RATIOS = (8, 4, 2, 1)
PATCH_SIZES = (7, 3, 3, 3)
PATCH_STRIDES = (4, 2, 2, 2)
MLP_RATIO = 4
CLASSIFIER_DROPOUT = 0.1


@dataclass(frozen=True)
class SegformerConfig:
    hidden_sizes: tuple[int, int, int, int]  # encoder width per stage
    depths: tuple[int, int, int, int]        # transformer blocks per stage
    decoder_dim: int                         # channels of the all-MLP decoder


_WIDE = (64, 128, 320, 512)
CONFIGS: dict[str, SegformerConfig] = {
    "b0": SegformerConfig((32, 64, 160, 256), (2, 2, 2, 2), 256),
    "b1": SegformerConfig(_WIDE, (2, 2, 2, 2), 256),
    "b2": SegformerConfig(_WIDE, (3, 4, 6, 3), 768),
    "b3": SegformerConfig(_WIDE, (3, 4, 18, 3), 768),
    "b4": SegformerConfig(_WIDE, (3, 8, 27, 3), 768),
    "b5": SegformerConfig(_WIDE, (3, 6, 40, 3), 768),
}


class PatchEmbed(nn.Module):
    """Overlapping patch embedding: strided conv (padding k // 2) then LayerNorm over channels."""

    def __init__(self, c_in: int, c_out: int, k: int, s: int):
        super().__init__()
        self.proj = nn.Conv2d(c_in, c_out, k, s, k // 2)
        self.layer_norm = nn.LayerNorm(c_out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        h, w = x.shape[-2:]
        return self.layer_norm(x.flatten(2).transpose(1, 2)), h, w


class SequenceReduction(nn.Module):
    """Shortens the key/value sequence r*r-fold: r x r conv with stride r, then LayerNorm."""

    def __init__(self, dim: int, ratio: int):
        super().__init__()
        self.sequence_reduction = nn.Conv2d(dim, dim, ratio, ratio)
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        x = self.sequence_reduction(x.transpose(1, 2).reshape(b, c, h, w))
        return self.layer_norm(x.flatten(2).transpose(1, 2))


class EfficientSelfAttention(nn.Module):
    """Multi-head attention whose keys / values come from a spatially reduced sequence."""

    def __init__(self, dim: int, heads: int, sr_ratio: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)
        self.sequence_reduction = SequenceReduction(dim, sr_ratio) if sr_ratio > 1 else None

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, c = t.shape
        return t.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        kv = x if self.sequence_reduction is None else self.sequence_reduction(x, h, w)
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(kv)), self._split(self.v_proj(kv))
        out = F.scaled_dot_product_attention(q, k, v)  # scale 1 / sqrt(head_dim)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DWConv(nn.Module):
    """3x3 depthwise conv applied to the token sequence folded back into its (H, W) map."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        x = self.dwconv(x.transpose(1, 2).reshape(b, c, h, w))
        return x.flatten(2).transpose(1, 2)


class MixFFN(nn.Module):
    """fc1 -> depthwise 3x3 conv -> GELU -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConv(hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        return self.fc2(F.gelu(self.dwconv(self.fc1(x), h, w)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(LN(x)), then x + Mix-FFN(LN(x))."""

    def __init__(self, dim: int, heads: int, sr_ratio: int):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(dim)
        self.attention = EfficientSelfAttention(dim, heads, sr_ratio)
        self.layernorm_after = nn.LayerNorm(dim)
        self.mlp = MixFFN(dim, dim * MLP_RATIO)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.attention(self.layernorm_before(x), h, w)
        return x + self.mlp(self.layernorm_after(x), h, w)


class Stage(nn.Module):
    """Patch embedding, transformer blocks and a closing LayerNorm; returns a (B, C, H, W) map."""

    def __init__(self, c_in: int, dim: int, depth: int, i: int):
        super().__init__()
        self.patch_embeddings = PatchEmbed(c_in, dim, PATCH_SIZES[i], PATCH_STRIDES[i])
        self.blocks = nn.ModuleList(Block(dim, NUM_HEADS[i], SR_RATIOS[i]) for _ in range(depth))
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = self.patch_embeddings(x)
        for block in self.blocks:
            x = block(x, h, w)
        x = self.layer_norm(x)
        return x.transpose(1, 2).reshape(x.shape[0], -1, h, w)


class MixTransformer(nn.Module):
    """MiT encoder: four stages at strides 4, 8, 16, 32."""

    def __init__(self, cfg: SegformerConfig):
        super().__init__()
        c_ins = (3,) + cfg.hidden_sizes[:-1]
        self.stages = nn.ModuleList(
            Stage(c_in, dim, depth, i)
            for i, (c_in, dim, depth) in enumerate(zip(c_ins, cfg.hidden_sizes, cfg.depths)))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats


class LinearProjection(nn.Module):
    """Per-pixel linear layer from a stage's width to the decoder width."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.proj = nn.Linear(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        x = self.proj(x.flatten(2).transpose(1, 2))
        return x.transpose(1, 2).reshape(b, -1, h, w)


class DecodeHead(nn.Module):
    """All-MLP decoder: project, upsample to 1/4, concatenate (deepest first), fuse, classify."""

    def __init__(self, hidden_sizes: tuple[int, ...], dim: int, nc: int):
        super().__init__()
        self.linear_projections = nn.ModuleList(LinearProjection(c, dim) for c in hidden_sizes)
        self.linear_fuse = nn.Conv2d(dim * len(hidden_sizes), dim, 1, bias=False)
        self.batch_norm = nn.BatchNorm2d(dim)
        self.dropout = nn.Dropout(CLASSIFIER_DROPOUT)
        self.classifier = nn.Conv2d(dim, nc, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        size = feats[0].shape[-2:]
        maps = [resize_bilinear(proj(f), size)
                for proj, f in zip(self.linear_projections, feats)]
        x = self.linear_fuse(torch.cat(maps[::-1], 1))
        x = self.dropout(F.relu(self.batch_norm(x)))
        return self.classifier(x)


class SegformerNet(nn.Module):
    """SegFormer: ``forward(x)`` maps RGB in [0, 1] (B, 3, H, W) to class logits (B, nc, H, W)."""

    def __init__(self, size: str, nc: int):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown SegFormer size {size!r}; expected one of {sorted(CONFIGS)}")
        if nc < 1:
            raise ValueError(f"SegFormer nc must be a positive number of classes, got {nc}")
        cfg = CONFIGS[size]
        self.size, self.nc, self.cfg = size, nc, cfg
        self.encoder = MixTransformer(cfg)
        self.decode_head = DecodeHead(cfg.hidden_sizes, cfg.decoder_dim, nc)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """1/4-resolution class logits (B, nc, ceil(H/4), ceil(W/4)) for RGB input in [0, 1]."""
        return self.decode_head(self.encoder((x - self.mean) / self.std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.forward_features(x)
        return resize_bilinear(logits, x.shape[-2:])
