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

The trunk's options (all off by default, which is EC's architecture) make the same modules
DINOv3-style ViTs, which DEIMv2's sizes s-x use (:mod:`..deimv2.nn`): a plain 16x16
patch-embedding conv, a leading token named ``cls_token``, extra register ("storage") tokens
and a ``mask_token``, LayerScale (``ls1``/``ls2``), a SwiGLU feed-forward (``w1``/``w2``/``w3``),
a key-bias mask on the fused qkv projection, a final LayerNorm on the returned tokens and a
training-time random rescaling of the rotary coordinates.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..common.transformer import GeluMlp
from ..detr_common.layers import ConvNorm

PATCH = 16


class RopeEmbedding2d(nn.Module):
    """2-D rotary position embedding (DINOv3 style) with coordinates normalised per axis.

    Each head dimension is split into (y, x) halves of ``head_dim // 4`` frequencies each; the
    coordinates are patch centres mapped to [-1, 1]. ``periods`` is stored in checkpoints.
    """

    def __init__(self, embed_dim: int, num_heads: int, base: float = 100.0, rescale_coords: float | None = None):
        super().__init__()
        #: DINOv3 option: in training mode, scale all coordinates by one random factor in
        #: [1/r, r] (log-uniform) per call; never applied in eval mode
        self.rescale_coords = rescale_coords
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
        if self.training and self.rescale_coords is not None:
            r = math.log(self.rescale_coords)
            coords = coords * torch.empty((), device=coords.device, dtype=coords.dtype).uniform_(-r, r).exp()
        angles = (2 * math.pi) * coords[:, :, None] / periods[None, None, :]   # (hw, 2, n)
        angles = angles.flatten(1, 2).repeat(1, 2)                              # (hw, 4n)
        return angles.sin()[None, None], angles.cos()[None, None]


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rotated * sin


class KeyBiasMaskedLinear(nn.Linear):
    """The fused qkv projection of DINOv3: its bias times the persistent buffer ``bias_mask``.

    Trained DINOv3 checkpoints store a mask of ones for the query and value thirds and zeros for
    the key third (no key bias); that is also the value it starts with here.
    """

    def __init__(self, dim: int, out: int):
        super().__init__(dim, out)
        mask = torch.ones(out)
        mask[out // 3: 2 * out // 3] = 0.0
        self.register_buffer("bias_mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias * self.bias_mask.to(self.bias.dtype))


class ViTAttention(nn.Module):
    """Multi-head self-attention; RoPE on the patch tokens, none on the leading (register) tokens.

    ``mask_k_bias``: the qkv projection is a :class:`KeyBiasMaskedLinear` (DINOv3).
    ``rope_fp32``: rotate queries and keys in float32 and cast back (DINOv3; EC rotates in the
    activations' dtype).
    """

    def __init__(self, dim: int, num_heads: int, mask_k_bias: bool = False, rope_fp32: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.rope_fp32 = rope_fp32
        self.qkv = KeyBiasMaskedLinear(dim, dim * 3) if mask_k_bias else nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        prefix = n - rope[0].shape[-2]   # leading tokens without a position
        dtype = torch.float32 if self.rope_fp32 else q.dtype
        sin, cos = (t.to(dtype) for t in rope)
        q = torch.cat((q[:, :, :prefix], _rotate(q[:, :, prefix:].to(dtype), sin, cos).to(q.dtype)), 2)
        k = torch.cat((k[:, :, :prefix], _rotate(k[:, :, prefix:].to(dtype), sin, cos).to(k.dtype)), 2)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class ViTSwiGLU(nn.Module):
    """DINOv3's SwiGLU feed-forward: ``w3(silu(w1(x)) * w2(x))``; the hidden width is 2/3 of
    ``hidden`` rounded up to a multiple of 8."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        width = int(hidden * 2 / 3)
        width += -width % 8
        self.w1 = nn.Linear(dim, width)
        self.w2 = nn.Linear(dim, width)
        self.w3 = nn.Linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class LayerScale(nn.Module):
    """Per-channel scale ``gamma`` of a residual branch (DINOv3)."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class ViTBlock(nn.Module):
    """Pre-norm transformer block (LayerNorm eps 1e-6 by default).

    DINOv3 options: ``norm_eps`` (1e-5), ``layer_scale`` (initial LayerScale value: adds
    ``ls1``/``ls2``), ``ffn="swiglu"`` (:class:`ViTSwiGLU` instead of the GELU MLP,
    :class:`~..common.transformer.GeluMlp`), and the attention options ``mask_k_bias`` /
    ``rope_fp32`` (:class:`ViTAttention`).
    """

    def __init__(self, dim: int, num_heads: int, ffn_ratio: float = 4.0, *, norm_eps: float = 1e-6,
                 layer_scale: float | None = None, ffn: str = "mlp", mask_k_bias: bool = False,
                 rope_fp32: bool = False):
        super().__init__()
        if ffn not in ("mlp", "swiglu"):
            raise ValueError(f"unknown ViT feed-forward {ffn!r} (expected 'mlp' or 'swiglu')")
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = ViTAttention(dim, num_heads, mask_k_bias, rope_fp32)
        if layer_scale is not None:
            self.ls1 = LayerScale(dim, layer_scale)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        hidden = int(dim * ffn_ratio)
        self.mlp = GeluMlp(dim, hidden) if ffn == "mlp" else ViTSwiGLU(dim, hidden)
        if layer_scale is not None:
            self.ls2 = LayerScale(dim, layer_scale)
        self.layer_scale = layer_scale is not None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if self.layer_scale:
            x = x + self.ls1(self.attn(self.norm1(x), rope))
            return x + self.ls2(self.mlp(self.norm2(x)))
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


class ConvPatchEmbed(nn.Module):
    """Patch size 16 as one 16x16 / 16 biased conv ``proj`` (ViT / DINOv3)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, embed_dim, PATCH, PATCH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class ECViT(nn.Module):
    """The ViT trunk: returns the patch tokens (leading tokens dropped) of ``return_layers``.

    Defaults are EC's trunk. Options (additive; each off by default):
    ``patch_embed`` "pyramid" (EC) or "conv" (:class:`ConvPatchEmbed`); ``token_name``, the
    checkpoint name of the leading token ("register_token" in EC, "cls_token" in ViT / DINOv3);
    ``num_storage_tokens`` register tokens after it (``storage_tokens``, DINOv3: 4);
    ``mask_token`` (DINOv3's masked-patch embedding: unused at inference, kept for the layout);
    ``final_norm`` (a LayerNorm ``norm`` applied to every returned layer, eps ``norm_eps``);
    ``rope_rescale`` (see :class:`RopeEmbedding2d`); the block options of :class:`ViTBlock`.
    """

    def __init__(self, embed_dim: int, num_heads: int, depth: int = 12, ffn_ratio: float = 4.0,
                 return_layers: tuple[int, ...] = (10, 11), *, patch_embed: str = "pyramid",
                 token_name: str = "register_token", num_storage_tokens: int = 0, mask_token: bool = False,
                 norm_eps: float = 1e-6, layer_scale: float | None = None, ffn: str = "mlp",
                 mask_k_bias: bool = False, rope_fp32: bool = False, final_norm: bool = False,
                 rope_rescale: float | None = None):
        super().__init__()
        if patch_embed not in ("pyramid", "conv"):
            raise ValueError(f"unknown patch embedding {patch_embed!r} (expected 'pyramid' or 'conv')")
        self.return_layers = tuple(return_layers)
        self.token_name = token_name
        self.num_prefix = 1 + num_storage_tokens
        setattr(self, token_name, nn.Parameter(torch.zeros(1, 1, embed_dim)))
        if num_storage_tokens:
            self.storage_tokens = nn.Parameter(torch.zeros(1, num_storage_tokens, embed_dim))
        if mask_token:
            self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))
        self.patch_embed = ConvPyramidPatchEmbed(embed_dim) if patch_embed == "pyramid" else ConvPatchEmbed(embed_dim)
        self.blocks = nn.ModuleList(
            ViTBlock(embed_dim, num_heads, ffn_ratio, norm_eps=norm_eps, layer_scale=layer_scale, ffn=ffn,
                     mask_k_bias=mask_k_bias, rope_fp32=rope_fp32) for _ in range(depth))
        self.rope_embed = RopeEmbedding2d(embed_dim, num_heads, rescale_coords=rope_rescale)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps) if final_norm else None
        nn.init.trunc_normal_(getattr(self, token_name), std=0.02)
        if num_storage_tokens:
            nn.init.normal_(self.storage_tokens, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], int, int]:
        tokens = self.patch_embed(x)
        h, w = tokens.shape[-2:]
        tokens = tokens.flatten(2).transpose(1, 2)
        b = tokens.shape[0]
        lead = [getattr(self, self.token_name).expand(b, -1, -1)]
        if self.num_prefix > 1:
            lead.append(self.storage_tokens.expand(b, -1, -1))
        x = torch.cat(lead + [tokens], 1)
        rope = self.rope_embed(h, w)
        outs = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, rope)
            if i in self.return_layers:
                patches = x[:, self.num_prefix:]
                outs.append(self.norm(patches) if self.norm is not None else patches)
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
