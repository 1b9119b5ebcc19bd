"""LingBot-Vision semantic-segmentation network: the LingBot-Vision ViT (Robbyant's release, a
DINOv3-style Vision Transformer) with a 1x1 dense head over its patch tokens (the report's linear
probe), in the LibreYOLO checkpoint layout: ``backbone.*`` keeps the upstream module names, so an
upstream backbone state dict is this layout's ``backbone.`` part as it is; ``predict`` is the head.

Backbone (``backbone``): a 16x16 stride-16 patch embedding (``patch_embed.proj``, with bias); the
token sequence is ``[cls_token, 4 storage (register) tokens, patch tokens]`` - no learned position
embedding: positions enter as 2-D rotary embeddings (RoPE) on the queries and keys of the patch
tokens only (the five prefix tokens are not rotated). ``rope_embed.periods`` (D_head / 4 periods,
``100 ** (2 i / (D_head / 2))``) is a checkpoint buffer; each patch's coordinates are its centre
normalised per axis to [-1, 1] (``(i + 0.5) / h * 2 - 1``), the angle of period p is
``2 pi * coord / p`` for the row coordinate then the column coordinate (D_head / 2 angles),
tiled twice, and the rotation is ``x * cos + rotate_half(x) * sin`` with ``rotate_half`` swapping
the two halves of the head dimension (the second negated) - all in float32. Blocks are pre-norm:
``x + ls1 * attn(norm1(x))``, ``x + ls2 * mlp(norm2(x))`` with LayerScale vectors ``ls*.gamma``;
attention uses one fused ``qkv`` linear whose bias is multiplied by the ``bias_mask`` buffer (the
key third zeroed: keys carry no bias), scaled dot-product attention (scale D_head^-0.5), ``proj``;
the MLP is fc1 -> exact GELU -> fc2 (4x), SwiGLU for size g (hidden 2/3 of 4x, rounded up to a
multiple of 8). Every LayerNorm has eps 1e-5 (the release's "layernormbf16"); a final ``norm``.
``mask_token`` is part of the checkpoint but unused at inference (masked-image pretraining only).

Head (``predict``): a 1x1 conv from the normed patch tokens folded to their (h, w) grid, giving
``{"semantic_logits": (B, nc, H/16, W/16)}``.

Input: RGB in [0, 1], H and W multiples of 16; the network normalizes it with the ImageNet mean /
std (non-persistent buffers, not in the layout). The fixture's ``input_convention_in_real_use``
says the normalization happens outside the network, but its outputs are reproduced only with it
inside (relative L2 3.8e-7; 0.90 without), as the reference's own network does.

Why not timm: timm's DINOv3 ViTs (``eva.py``) compute the same kind of network, but their state
dict does not map onto this layout without renaming every block entry (``gamma_1`` for
``ls1.gamma``, ``reg_token`` for ``storage_tokens``), and it has neither the ``bias_mask`` nor the
``rope_embed.periods`` buffers, which checkpoints in this layout carry and which fix the numbers
(timm derives its RoPE periods from its own settings). A LibreYOLO checkpoint must load strictly
and save back unchanged, so the network is written here: it is short.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PATCH_SIZE = 16
N_STORAGE_TOKENS = 4
ROPE_BASE = 100.0
LAYERSCALE_INIT = 1e-5
LN_EPS = 1e-5


@dataclass(frozen=True)
class LingBotVisionConfig:
    dim: int         # token width
    depth: int       # transformer blocks
    heads: int       # attention heads (head width 64 for every size)
    swiglu: bool     # SwiGLU MLP in place of fc1 / GELU / fc2
    qkv_bias: bool   # the fused qkv linear has a (key-masked) bias


CONFIGS: dict[str, LingBotVisionConfig] = {
    "s": LingBotVisionConfig(384, 12, 6, False, True),
    "b": LingBotVisionConfig(768, 12, 12, False, True),
    "l": LingBotVisionConfig(1024, 24, 16, False, True),
    "g": LingBotVisionConfig(1536, 40, 24, True, False),
}


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), LAYERSCALE_INIT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class PatchEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, PATCH_SIZE, PATCH_SIZE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)   # (B, h*w, D), row-major over the grid


class RopePositionEmbedding(nn.Module):
    """The sin / cos tables of the 2-D rotary embedding for an (h, w) patch grid (see the module
    docstring); ``periods`` is a persistent buffer (the checkpoint's values are used)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        d_head = dim // heads
        if d_head % 4:
            raise ValueError(f"the RoPE head width must be a multiple of 4, got {d_head}")
        periods = ROPE_BASE ** (2 * torch.arange(d_head // 4, dtype=torch.float32) / (d_head // 2))
        self.register_buffer("periods", periods)

    def forward(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.periods.device
        ch = torch.arange(0.5, h, device=dev, dtype=torch.float32) / h
        cw = torch.arange(0.5, w, device=dev, dtype=torch.float32) / w
        coords = torch.stack(torch.meshgrid(ch, cw, indexing="ij"), -1).flatten(0, 1) * 2.0 - 1.0   # (hw, 2)
        angles = 2 * math.pi * coords[:, :, None] / self.periods.float()[None, None, :]           # (hw, 2, D/4)
        angles = angles.flatten(1, 2).tile(2)                                                       # (hw, D)
        return torch.sin(angles), torch.cos(angles)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def _rope(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Rotate the patch tokens of ``x`` (B, heads, N, d); the leading prefix tokens stay as they are."""
    prefix = x.shape[-2] - sin.shape[-2]
    dtype = x.dtype
    x = x.to(sin.dtype)
    patches = x[:, :, prefix:] * cos + _rotate_half(x[:, :, prefix:]) * sin
    return torch.cat([x[:, :, :prefix], patches], dim=-2).to(dtype)


class LinearKMaskedBias(nn.Linear):
    """The fused qkv linear: its bias times the ``bias_mask`` buffer (ones, the key third zero)."""

    def __init__(self, c_in: int, c_out: int, bias: bool):
        super().__init__(c_in, c_out, bias=bias)
        if bias:
            mask = torch.ones(c_out)
            mask[c_out // 3:2 * c_out // 3] = 0
            self.register_buffer("bias_mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias * self.bias_mask.to(self.bias.dtype)
        return F.linear(x, self.weight, bias)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, qkv_bias: bool):
        super().__init__()
        self.heads = heads
        self.qkv = LinearKMaskedBias(dim, dim * 3, qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        sin, cos = rope
        q, k = _rope(q, sin, cos), _rope(k, sin, cos)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLUFFN(nn.Module):
    """``w3(silu(w1 x) * w2 x)``, hidden width 2/3 of ``hidden`` rounded up to a multiple of 8."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        h = int(hidden * 2 / 3)
        h += -h % 8
        self.w1 = nn.Linear(dim, h)
        self.w2 = nn.Linear(dim, h)
        self.w3 = nn.Linear(h, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class Block(nn.Module):
    def __init__(self, cfg: LingBotVisionConfig):
        super().__init__()
        d = cfg.dim
        self.norm1 = nn.LayerNorm(d, eps=LN_EPS)
        self.attn = SelfAttention(d, cfg.heads, cfg.qkv_bias)
        self.ls1 = LayerScale(d)
        self.norm2 = nn.LayerNorm(d, eps=LN_EPS)
        self.mlp = SwiGLUFFN(d, 4 * d) if cfg.swiglu else Mlp(d, 4 * d)
        self.ls2 = LayerScale(d)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope))
        return x + self.ls2(self.mlp(self.norm2(x)))


class LingBotVisionBackbone(nn.Module):
    """The ViT trunk: (B, 3, H, W) normalized image -> normed patch tokens (B, h*w, D)."""

    def __init__(self, cfg: LingBotVisionConfig):
        super().__init__()
        d = cfg.dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.storage_tokens = nn.Parameter(torch.zeros(1, N_STORAGE_TOKENS, d))
        self.mask_token = nn.Parameter(torch.zeros(1, d))
        self.patch_embed = PatchEmbed(d)
        self.rope_embed = RopePositionEmbedding(d, cfg.heads)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(d, eps=LN_EPS)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.storage_tokens, std=0.02)
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.trunc_normal_(mod.weight, std=0.02)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2] // PATCH_SIZE, x.shape[-1] // PATCH_SIZE
        tokens = self.patch_embed(x)
        prefix = torch.cat([self.cls_token, self.storage_tokens], 1).expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([prefix.to(tokens.dtype), tokens], 1)
        rope = self.rope_embed(h, w)
        for block in self.blocks:
            tokens = block(tokens, rope)
        return self.norm(tokens)[:, 1 + N_STORAGE_TOKENS:]


class LingBotVisionNet(nn.Module):
    """LingBot-Vision + 1x1 head: ``forward(x)`` maps RGB in [0, 1] (B, 3, H, W), H and W multiples
    of 16, to ``{"semantic_logits": (B, nc, H/16, W/16)}``."""

    def __init__(self, size: str, nc: int):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown LingBot-Vision size {size!r}; expected one of {sorted(CONFIGS)}")
        if nc < 1:
            raise ValueError(f"LingBot-Vision nc must be a positive number of classes, got {nc}")
        cfg = CONFIGS[size]
        self.size, self.nc, self.cfg = size, nc, cfg
        self.backbone = LingBotVisionBackbone(cfg)
        self.predict = nn.Conv2d(cfg.dim, nc, 1)
        nn.init.trunc_normal_(self.predict.weight, std=0.02)
        nn.init.zeros_(self.predict.bias)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hh, ww = x.shape[-2], x.shape[-1]
        if hh % PATCH_SIZE or ww % PATCH_SIZE:
            raise ValueError(f"LingBot-Vision input {hh}x{ww}: both sides must be multiples of the "
                             f"{PATCH_SIZE}-pixel patch")
        tokens = self.backbone((x - self.mean) / self.std)
        grid = tokens.transpose(1, 2).reshape(x.shape[0], -1, hh // PATCH_SIZE, ww // PATCH_SIZE)
        return {"semantic_logits": self.predict(grid)}
