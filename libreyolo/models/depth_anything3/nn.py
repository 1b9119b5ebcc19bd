"""Depth Anything 3 network (DA3-Mono-Large, ByteDance-Seed/Depth-Anything-3, Apache-2.0): the
ViT encoder and DPT head of Depth Anything V2 (:mod:`..depth_anything.nn`, shared, not copied)
with DA3's differences, in the LibreYOLO checkpoint layout (``backbone.pretrained.*``,
``head.*``), pinned by the architecture fixture ``depth_anything3-l``.

Encoder (``backbone.pretrained``): V2's :class:`DinoViT` at ViT-L/14 (24 blocks, width 1024, 16
heads, blocks 4, 11, 17, 23 to the head), without the mask token and with a closing LayerNorm of
epsilon 1e-5 (DA3 builds it as a default ``nn.LayerNorm``; the blocks keep 1e-6). The
position embedding is V2's (37 x 37 grid, bicubic resize by the scale factor, 0.1 offset). DA3's
ViT also carries 2-D rotary position embeddings (RoPE), QK-norm and alternating cross-view
attention, but the mono configuration switches all three off (``rope_start``,
``qknorm_start`` and ``alt_start`` are -1, ``cat_token`` false): the mono network is a plain
DINOv2 ViT, and reproduces the fixture so (the any-view models, which use them from block 8,
are not served: they need several images and cameras).

Head (``head``): V2's :class:`DPTHead` (projections, resize layers, ``scratch.layerN_rn``) with
DA3's :class:`Scratch`: the fusion blocks register their convs in DA3's order, the deepest one
(``refinenet4``) has no lateral unit, and two output branches share ``output_conv1``:
``output_conv2`` (3x3 -> 32, ReLU, 1x1 -> 1, no closing ReLU) gives the log depth, and
``sky_output_conv2`` (same shape) a sky score, ReLU'd.

Output: depth = exp(log depth); where DA3-Mono's sky step applies (:func:`sky_to_far`) sky
pixels take the 0.99 quantile of the image's other depths; the network returns the relative
inverse depth ``1 / max(depth, 1e-6)`` (B, 1, H, W), higher = closer, the depth task's
contract. H and W must be multiples of 14. Shapes derive from the input's static size and the
sky step is computed for every image without a host synchronisation (graph-safe).
"""
from __future__ import annotations

import torch
from torch import nn

from ..depth_anything.nn import (
    CONFIGS as V2_CONFIGS,
)
from ..depth_anything.nn import (
    HEAD_FEATURES_2,
    IMAGENET_MEAN,
    IMAGENET_STD,
    PATCH,
    DepthAnythingConfig,
    DinoViT,
    DPTHead,
    FusionBlock,
    ResidualConvUnit,
)

#: DA3-Mono-Large: V2's ViT-L/14 configuration (blocks 4, 11, 17, 23; DPT features 256)
CONFIGS: dict[str, DepthAnythingConfig] = {"l": V2_CONFIGS["l"]}
#: the floor of the depth before it is inverted (DA3's LibreYOLO checkpoints' contract)
INVERSE_DEPTH_EPS = 1e-6
#: DA3-Mono's sky step: a pixel whose sky score is at least this is sky ...
SKY_THRESHOLD = 0.3
#: ... and takes this quantile of the image's non-sky depths ...
SKY_FAR_QUANTILE = 0.99
#: ... when the image has more than this many sky and this many non-sky pixels
SKY_MIN_PIXELS = 10


class DA3FusionBlock(FusionBlock):
    """V2's fusion block (same forward) with DA3's parameter order (residual units, then the 1x1
    out conv); ``lateral=False``: no lateral unit (the deepest block, which has no lateral map)."""

    def __init__(self, c: int, lateral: bool = True):
        nn.Module.__init__(self)
        if lateral:
            self.resConfUnit1 = ResidualConvUnit(c)
        self.resConfUnit2 = ResidualConvUnit(c)
        self.out_conv = nn.Conv2d(c, c, 1)


def _output_branch(c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, HEAD_FEATURES_2, 3, 1, 1), nn.ReLU(), nn.Conv2d(HEAD_FEATURES_2, 1, 1))


class Scratch(nn.Module):
    """DA3's DPT scratch: the four ``layerN_rn`` adapters, four fusion blocks, ``output_conv1`` and
    the two output branches (depth and sky)."""

    def __init__(self, out_channels: tuple[int, ...], features: int):
        super().__init__()
        for i, c in enumerate(out_channels, 1):
            setattr(self, f"layer{i}_rn", nn.Conv2d(c, features, 3, 1, 1, bias=False))
        for i in range(1, 5):
            setattr(self, f"refinenet{i}", DA3FusionBlock(features, lateral=i < 4))
        self.output_conv1 = nn.Conv2d(features, features // 2, 3, 1, 1)
        self.output_conv2 = _output_branch(features // 2)
        self.sky_output_conv2 = _output_branch(features // 2)


class Backbone(nn.Module):
    """The layout's ``backbone`` level: the ViT as ``pretrained``."""

    def __init__(self, cfg: DepthAnythingConfig):
        super().__init__()
        self.pretrained = DinoViT(cfg, mask_token=False, norm_eps=1e-5)


def sky_to_far(depth: torch.Tensor, sky: torch.Tensor) -> torch.Tensor:
    """DA3-Mono's sky step, per image: where an image has more than ``SKY_MIN_PIXELS`` sky pixels
    (score >= ``SKY_THRESHOLD``) and more than that many others, its sky pixels take the
    ``SKY_FAR_QUANTILE`` quantile of its other depths; other images are left as they are.

    (B, 1, H, W) depth and sky score -> (B, 1, H, W) depth, computed in float32 for every image
    with tensor operations only (no host synchronisation). The original draws a random sample
    of 100,000 pixels for the quantile of a larger image and mixes the views of one scene; here
    the quantile is exact and each image is its own scene.
    """
    d = depth.float().flatten(1)
    clear = sky.flatten(1) < SKY_THRESHOLD
    n_clear = clear.sum(1)
    use = (n_clear > SKY_MIN_PIXELS) & (d.shape[1] - n_clear > SKY_MIN_PIXELS)
    far = torch.stack([torch.nanquantile(torch.where(c, row, torch.nan), SKY_FAR_QUANTILE)
                       for row, c in zip(d, clear)])   # per image: torch.quantile's size limit is per call
    out = torch.where(use[:, None] & ~clear, far[:, None], d)
    return out.view(depth.shape)


class DepthAnything3Net(nn.Module):
    """(B, 3, H, W) RGB in [0, 1], H and W multiples of 14 -> (B, 1, H, W) relative inverse depth.

    ``cfg`` builds another configuration of the same code (tests use a tiny one)."""

    def __init__(self, size: str = "l", cfg: DepthAnythingConfig | None = None):
        super().__init__()
        if cfg is None:
            if size not in CONFIGS:
                raise ValueError(f"unknown Depth Anything 3 size {size!r}; sizes: {', '.join(CONFIGS)}")
            cfg = CONFIGS[size]
        self.cfg = cfg
        self.backbone = Backbone(cfg)
        self.head = DPTHead(cfg.embed_dim, cfg.features, cfg.out_channels, Scratch(cfg.out_channels, cfg.features))
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor, sky: bool = True) -> torch.Tensor:
        """``sky=False`` leaves out the sky step (the training forward: the loss sees the depth
        branch alone)."""
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"Depth Anything 3 expects a (B, 3, H, W) batch, got shape {tuple(x.shape)}")
        h, w = int(x.shape[-2]), int(x.shape[-1])
        if h % PATCH or w % PATCH:
            raise ValueError(f"Depth Anything 3 needs an input whose height and width are multiples of {PATCH}, "
                             f"got {h}x{w}")
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        tokens = self.backbone.pretrained(x, self.cfg.layers)
        feat = self.head.features(tokens, h // PATCH, w // PATCH)
        s = self.head.scratch
        # from the log depth on in float32 (under float16 autocast exp would overflow past e^11)
        depth = torch.exp(s.output_conv2(feat).float())
        if sky:
            depth = sky_to_far(depth, torch.relu(s.sky_output_conv2(feat).float()))
        return torch.reciprocal(depth.clamp_min(INVERSE_DEPTH_EPS))
