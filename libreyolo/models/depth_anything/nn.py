"""Depth Anything V2 network: a DINOv2-style ViT encoder and a DPT decoder head.

Layout follows the LibreYOLO checkpoints: ``pretrained`` is the ViT (``cls_token``, ``pos_embed``
for the native 518 px input = 37 x 37 patches + the class token, ``mask_token`` - kept for the
layout, unused at inference -, ``patch_embed.proj`` (14 x 14 conv, stride 14), ``blocks.N`` and
the closing ``norm``); ``depth_head`` is the DPT head (``projects.N``, ``resize_layers.{0,1,3}``,
``scratch.layerN_rn``, ``scratch.refinenetN``, ``scratch.output_conv1``, ``scratch.output_conv2``).
Size s is pinned by the architecture fixture; b and l use the widths of the Depth Anything V2
release (ViT-B/14 and ViT-L/14 encoders).

Encoder: the [0, 1] RGB input is normalized with the ImageNet mean / std (non-persistent buffers,
so not part of the checkpoint); the 14 x 14 patch embedding gives an (H/14) x (W/14) grid, the
class token is prepended and the position embedding added. The 37 x 37 patch part of the
embedding is resized to the actual grid as DINOv2 does: bicubic, no antialiasing, driven by the
scale factor ``(grid + 0.1) / 37`` (the 0.1 offset keeps the output size from rounding down), the
class token's entry is kept as it is. The blocks are timm's pre-norm ViT blocks (LayerNorm eps
1e-6, multi-head attention with a qkv bias, LayerScale ``ls1`` / ``ls2``, a GELU MLP of 4x width):
their parameter names are the checkpoint's. The outputs of four blocks (``LAYERS`` of the size)
each go through the final ``norm``; their class tokens are dropped (this head does not read them).

DPT head: each of the four token maps is folded back into its (H/14, W/14) grid, projected by a
1x1 conv and brought to 4x, 2x, 1x and 1/2x the grid (transposed convs 4/4 and 2/2, identity,
3x3 stride-2 conv); ``layerN_rn`` (3x3, no bias) maps each to ``features`` channels; four fusion
blocks (pre-activation residual conv units, bilinear 2x / to-the-next-map upsampling with
align_corners=True, a 1x1 out conv) fuse them from the deepest up; then ``output_conv1`` (3x3,
half the features), a bilinear resize (align_corners=True) to the input size, ``output_conv2``
(3x3 -> 32, ReLU, 1x1 -> 1, ReLU) and a final ReLU: relative inverse depth (disparity-like, >= 0),
(B, 1, H, W).

H and W must be multiples of 14. Every shape derives from the input's static size: no host
synchronisation and no data-dependent shapes (CUDA-graph safe).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

PATCH = 14
#: the position embedding's native grid (518 px / 14)
NATIVE_GRID = 37
#: DINOv2's offset to the target grid in the position-embedding resize's scale factor
POS_INTERP_OFFSET = 0.1
HEAD_FEATURES_2 = 32


@dataclass(frozen=True)
class DepthAnythingConfig:
    embed_dim: int
    depth: int
    heads: int
    layers: tuple[int, int, int, int]          # the blocks whose outputs feed the head
    features: int                              # DPT fusion width
    out_channels: tuple[int, int, int, int]    # DPT projection widths per level


CONFIGS: dict[str, DepthAnythingConfig] = {
    "s": DepthAnythingConfig(384, 12, 6, (2, 5, 8, 11), 64, (48, 96, 192, 384)),
    "b": DepthAnythingConfig(768, 12, 12, (2, 5, 8, 11), 128, (96, 192, 384, 768)),
    "l": DepthAnythingConfig(1024, 24, 16, (4, 11, 17, 23), 256, (256, 512, 1024, 1024)),
}


class PatchEmbed(nn.Module):
    """14 x 14 patches, stride 14 -> (B, N, C) tokens."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, PATCH, PATCH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class DinoViT(nn.Module):
    """The DINOv2-style ViT encoder (see the module docstring); :meth:`forward` returns the
    normalized patch tokens (B, N, C) of the requested blocks."""

    def __init__(self, cfg: DepthAnythingConfig, *, mask_token: bool = True, norm_eps: float = 1e-6):
        """``mask_token``: the layout holds DINOv2's (unused) mask token; ``norm_eps``: the closing
        norm's epsilon (the blocks' norms keep 1e-6). Depth Anything 3 has no mask token and
        closes with a default ``nn.LayerNorm`` (1e-5)."""
        super().__init__()
        from timm.models.vision_transformer import Block
        dim = cfg.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, NATIVE_GRID * NATIVE_GRID + 1, dim))
        if mask_token:
            self.mask_token = nn.Parameter(torch.zeros(1, dim))
        self.patch_embed = PatchEmbed(dim)
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.blocks = nn.ModuleList([Block(dim, cfg.heads, mlp_ratio=4.0, qkv_bias=True, init_values=1.0,
                                           norm_layer=norm) for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)

    def position_embedding(self, gh: int, gw: int) -> torch.Tensor:
        """(1, 1 + gh * gw, C): the class entry and the patch grid resized to gh x gw."""
        pos = self.pos_embed
        if (gh, gw) == (NATIVE_GRID, NATIVE_GRID):
            return pos
        dim = pos.shape[-1]
        grid = pos[:, 1:].float().reshape(1, NATIVE_GRID, NATIVE_GRID, dim).permute(0, 3, 1, 2)
        scale = ((gh + POS_INTERP_OFFSET) / NATIVE_GRID, (gw + POS_INTERP_OFFSET) / NATIVE_GRID)
        grid = F.interpolate(grid, scale_factor=scale, mode="bicubic", align_corners=False)
        if tuple(grid.shape[-2:]) != (gh, gw):   # cannot happen for grids up to the size limit
            raise RuntimeError(f"position-embedding resize gave {tuple(grid.shape[-2:])}, wanted {(gh, gw)}")
        grid = grid.permute(0, 2, 3, 1).reshape(1, gh * gw, dim).to(pos.dtype)
        return torch.cat([pos[:, :1], grid], 1)

    def forward(self, x: torch.Tensor, layers: tuple[int, ...]) -> list[torch.Tensor]:
        gh, gw = x.shape[-2] // PATCH, x.shape[-1] // PATCH
        t = self.patch_embed(x)
        t = torch.cat([self.cls_token.expand(t.shape[0], -1, -1).to(t.dtype), t], 1)
        t = t + self.position_embedding(gh, gw)
        outs = []
        for i, blk in enumerate(self.blocks):
            t = blk(t)
            if i in layers:
                outs.append(self.norm(t)[:, 1:])
        return outs


class ResidualConvUnit(nn.Module):
    """x + conv2(relu(conv1(relu(x)))), 3x3 convs with bias."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, 1, 1)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(F.relu(x)))) + x


class FusionBlock(nn.Module):
    """Adds the refined lateral map (if any) to the path, refines, upsamples (to ``size`` or
    2x, bilinear, align_corners=True) and applies the 1x1 out conv."""

    def __init__(self, c: int):
        super().__init__()
        self.out_conv = nn.Conv2d(c, c, 1)
        self.resConfUnit1 = ResidualConvUnit(c)
        self.resConfUnit2 = ResidualConvUnit(c)

    def forward(self, path: torch.Tensor, lateral: torch.Tensor | None = None,
                size: tuple[int, int] | None = None) -> torch.Tensor:
        if lateral is not None:
            path = path + self.resConfUnit1(lateral)
        path = self.resConfUnit2(path)
        if size is None:
            path = F.interpolate(path, scale_factor=2, mode="bilinear", align_corners=True)
        else:
            path = F.interpolate(path, size=size, mode="bilinear", align_corners=True)
        return self.out_conv(path)


class Scratch(nn.Module):
    def __init__(self, out_channels: tuple[int, ...], features: int):
        super().__init__()
        for i, c in enumerate(out_channels, 1):
            setattr(self, f"layer{i}_rn", nn.Conv2d(c, features, 3, 1, 1, bias=False))
        for i in range(1, 5):
            setattr(self, f"refinenet{i}", FusionBlock(features))
        self.output_conv1 = nn.Conv2d(features, features // 2, 3, 1, 1)
        self.output_conv2 = nn.Sequential(nn.Conv2d(features // 2, HEAD_FEATURES_2, 3, 1, 1), nn.ReLU(),
                                          nn.Conv2d(HEAD_FEATURES_2, 1, 1), nn.ReLU(), nn.Identity())


class DPTHead(nn.Module):
    """The DPT decoder (see the module docstring)."""

    def __init__(self, dim: int, features: int, out_channels: tuple[int, int, int, int],
                 scratch: nn.Module | None = None):
        """``scratch``: the fusion and output part (default: Depth Anything V2's :class:`Scratch`)."""
        super().__init__()
        self.projects = nn.ModuleList([nn.Conv2d(dim, c, 1) for c in out_channels])
        c0, c1, _, c3 = out_channels
        self.resize_layers = nn.ModuleList([nn.ConvTranspose2d(c0, c0, 4, 4), nn.ConvTranspose2d(c1, c1, 2, 2),
                                            nn.Identity(), nn.Conv2d(c3, c3, 3, 2, 1)])
        self.scratch = Scratch(out_channels, features) if scratch is None else scratch

    def forward(self, tokens: list[torch.Tensor], gh: int, gw: int) -> torch.Tensor:
        return self.scratch.output_conv2(self.features(tokens, gh, gw))

    def features(self, tokens: list[torch.Tensor], gh: int, gw: int) -> torch.Tensor:
        """Everything before ``output_conv2``: the fused map after ``output_conv1``, resized to
        the input size (B, features / 2, 14 gh, 14 gw)."""
        maps = []
        for i, t in enumerate(tokens):
            x = t.transpose(1, 2).reshape(t.shape[0], t.shape[-1], gh, gw)
            maps.append(self.resize_layers[i](self.projects[i](x)))
        s = self.scratch
        l1, l2, l3, l4 = s.layer1_rn(maps[0]), s.layer2_rn(maps[1]), s.layer3_rn(maps[2]), s.layer4_rn(maps[3])
        p = s.refinenet4(l4, size=tuple(l3.shape[-2:]))
        p = s.refinenet3(p, l3, size=tuple(l2.shape[-2:]))
        p = s.refinenet2(p, l2, size=tuple(l1.shape[-2:]))
        p = s.refinenet1(p, l1)
        out = s.output_conv1(p)
        return F.interpolate(out, size=(gh * PATCH, gw * PATCH), mode="bilinear", align_corners=True)


class DepthAnythingNet(nn.Module):
    """(B, 3, H, W) RGB in [0, 1], H and W multiples of 14 -> (B, 1, H, W) relative inverse depth."""

    def __init__(self, size: str):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown Depth Anything size {size!r}; sizes: {', '.join(CONFIGS)}")
        cfg = self.cfg = CONFIGS[size]
        self.pretrained = DinoViT(cfg)
        self.depth_head = DPTHead(cfg.embed_dim, cfg.features, cfg.out_channels)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[-2]), int(x.shape[-1])
        if h % PATCH or w % PATCH:
            raise ValueError(f"Depth Anything needs an input whose height and width are multiples of {PATCH}, "
                             f"got {h}x{w}")
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        tokens = self.pretrained(x, self.cfg.layers)
        return F.relu(self.depth_head(tokens, h // PATCH, w // PATCH))
