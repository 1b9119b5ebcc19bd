"""ZipDepth network: a re-parameterizable CNN for relative monocular depth (ZipDepth, Tosi et al.,
https://github.com/fabiotosi92/ZipDepth, MIT). Our own module tree in the LibreYOLO checkpoint
layout (``encoder.*``, ``decoder.*`` and the persistent ``mean`` / ``std`` buffers), size b =
upstream's "base" variant, pinned by the architecture fixture ``zipdepth-b``.

Encoder (``encoder``): a stride-2 stem (``stem_half``, 3x3 ConvBN + ReLU, dims[0] / 2 channels),
a second one to stride 4 (``stem_quarter``), then four stages of RepVGG-style blocks
(:class:`RepBlock`: 3x3 conv + BN, 1x1 conv + BN and the identity where the shapes allow,
summed, ReLU), each of stages 2-4 entered by a stride-2 block (``down2`` .. ``down4``). After
the last block of stage 2: a depthwise two-dilation context block (:class:`MultiDilation`) and a
strip-pooling gate (:class:`StripGate`); after the last of stage 3: squeeze-and-excitation
(:class:`SqueezeExcite`) and a GCNet-style global context (:class:`GlobalContext`). Stage 4 goes
through a light SPPF (``spp``), then stages 3 and 4 exchange features (``cross_scale``: grouped
1x1 convs, nearest upsampling one way, adaptive average pooling the other, added at 0.3).

Decoder (``decoder``): stage 4 projected (``proj4``, 1x1 ConvBN + ReLU), then top-down fusions
(:class:`Fuse`: grouped 1x1 projections of the finer map and of the bilinearly upsampled coarser
one, summed, BN, ReLU) down to stride 4 (``fuse3``, ``fuse2``, ``fuse1``) and the stem's stride-2
map (``fuse_half``); ``head_half`` (3x3 conv) predicts the half-resolution depth, and
``convex_up`` (:class:`ConvexUpsample`) brings it to the input size: a small conv predicts, per
output sub-pixel, softmax weights over the 3x3 neighbourhood of the half-resolution map
(replicate-padded, gathered with ``F.unfold``), RAFT's convex upsampling. A final ReLU: relative
inverse depth (higher = closer, >= 0), (B, 1, H, W); H and W multiples of 32.

Checkpoints hold the multi-branch (training) form. :meth:`ZipDepthNet.fuse` re-parameterizes
every :class:`RepBlock` into one 3x3 conv and folds the BatchNorm of every conv + BN pair: the
same function up to float32 rounding (relative L2 ~1e-6 on the fixture), fewer and cheaper ops.
Every shape derives from the input's static size (no host synchronisation; graph-safe).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.blocks import fold_bn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the encoder's deepest stride: H and W must be multiples of it
STRIDE = 32


@dataclass(frozen=True)
class ZipDepthConfig:
    dims: tuple[int, int, int, int]     # stage widths (strides 4, 8, 16, 32)
    depths: tuple[int, int, int, int]   # RepBlocks per stage
    dec_ch: int                         # decoder width at stride 4 (x1.5, x2, x3 deeper)
    half_dec_ch: int                    # width of the stride-2 fusion feeding the head


#: upstream's released variant ("base"); its other configurations have no released weights
CONFIGS: dict[str, ZipDepthConfig] = {
    "b": ZipDepthConfig((48, 96, 192, 384), (2, 2, 6, 2), 96, 32),
}


def _groups(c_in: int, c_out: int, most: int = 4) -> int:
    """The largest of 4, 2, 1 dividing both channel counts (the grouped 1x1 projections)."""
    for g in (most, 2, 1):
        if c_in % g == 0 and c_out % g == 0:
            return g
    return 1


class ConvBNReLU(nn.Module):
    """Conv (no bias) -> BatchNorm -> ReLU; :meth:`fuse` folds the BatchNorm into the conv."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return F.relu(x if self.bn is None else self.bn(x))

    @torch.no_grad()
    def fuse(self) -> None:
        if self.bn is None:
            return
        self.conv = _conv_from(self.conv, *fold_bn(self.conv.weight, None, self.bn))
        self.bn = None


def _conv_from(like: nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor) -> nn.Conv2d:
    """A conv with ``like``'s geometry holding ``weight`` and ``bias`` (no gradients: inference)."""
    conv = nn.Conv2d(like.in_channels, like.out_channels, weight.shape[-1], like.stride,
                     weight.shape[-1] // 2, dilation=like.dilation, groups=like.groups, bias=True)
    conv.to(device=weight.device, dtype=weight.dtype)
    conv.weight.copy_(weight)
    conv.bias.copy_(bias)
    return conv.requires_grad_(False)


class RepBlock(nn.Module):
    """RepVGG / QARep block: ``branch_3x3`` (conv + BN) + ``branch_1x1`` (conv + BN) + the input
    itself where channels and stride allow, then ReLU; :meth:`fuse` makes it one 3x3 conv."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.identity = c_in == c_out and stride == 1
        self.branch_3x3 = nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out))
        self.branch_1x1 = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, 0, bias=False), nn.BatchNorm2d(c_out))
        self.fused: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return F.relu(self.fused(x))
        y = self.branch_3x3(x) + self.branch_1x1(x)
        return F.relu(y + x if self.identity else y)

    @torch.no_grad()
    def fuse(self) -> None:
        if self.fused is not None:
            return
        conv3 = self.branch_3x3[0]
        w3, b3 = fold_bn(conv3.weight, None, self.branch_3x3[1])
        w1, b1 = fold_bn(self.branch_1x1[0].weight, None, self.branch_1x1[1])
        w = w3 + F.pad(w1, [1, 1, 1, 1])
        if self.identity:   # the input as a 3x3 kernel: 1 at the centre of each channel's own tap
            idx = torch.arange(w.shape[0], device=w.device)
            w[idx, idx, 1, 1] += 1.0
        self.fused = _conv_from(conv3, w, b3 + b1)
        del self.branch_3x3, self.branch_1x1


class MultiDilation(nn.Module):
    """x + BN(depthwise 3x3 + depthwise 3x3 at dilation 2)."""

    def __init__(self, c: int):
        super().__init__()
        self.branch1 = nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
        self.branch2 = nn.Conv2d(c, c, 3, 1, 2, dilation=2, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn(self.branch1(x) + self.branch2(x))


class StripGate(nn.Module):
    """x * sigmoid(BN(per-channel scale(row means + column means))): strip pooling."""

    def __init__(self, c: int):
        super().__init__()
        self.gate_conv = nn.Sequential(nn.Conv2d(c, c, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate_conv(x.mean(3, keepdim=True) + x.mean(2, keepdim=True))


class SqueezeExcite(nn.Module):
    """x * sigmoid(fc(relu(fc(global mean)))), bottleneck of c / 8 (at least 4) channels."""

    def __init__(self, c: int, reduction: int = 8):
        super().__init__()
        hidden = max(c // reduction, 4)
        self.fc = nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.ReLU(),
                                nn.Conv2d(hidden, c, 1, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(x.mean((2, 3), keepdim=True))


class GlobalContext(nn.Module):
    """GCNet's global context with BatchNorm: a softmax over the positions (``context_weight``)
    pools one context vector, transformed by a 1x1 bottleneck (c / 4, at least 8) and added."""

    def __init__(self, c: int, reduction: int = 4):
        super().__init__()
        hidden = max(c // reduction, 8)
        self.context_weight = nn.Conv2d(c, 1, 1)
        self.transform = nn.Sequential(nn.Conv2d(c, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU(),
                                       nn.Conv2d(hidden, c, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        attn = self.context_weight(x).flatten(2).softmax(-1)             # (B, 1, HW)
        context = torch.bmm(x.flatten(2), attn.transpose(1, 2))          # (B, C, 1)
        return x + self.transform(context.view(b, c, 1, 1))


class LightSPPF(nn.Module):
    """SPPF with a quarter-width hidden map: 1x1, three chained 5x5 max-pools, concat, 1x1."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        hidden = c_in // 4
        self.cv1 = ConvBNReLU(c_in, hidden)
        self.cv2 = ConvBNReLU(4 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(F.max_pool2d(y[-1], 5, 1, 2))
        return self.cv2(torch.cat(y, 1))


class CrossScale(nn.Module):
    """Stage 3 (``high``, stride 16) and stage 4 (``low``, stride 32) exchange features: each
    gets 0.3 x the other's grouped 1x1 projection, resized to its grid (nearest up / mean down)."""

    def __init__(self, c_high: int, c_low: int):
        super().__init__()
        self.low_to_high = nn.Conv2d(c_low, c_high, 1, groups=_groups(c_low, c_high), bias=False)
        self.high_to_low = nn.Conv2d(c_high, c_low, 1, groups=_groups(c_high, c_low), bias=False)

    def forward(self, high: torch.Tensor, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        up = F.interpolate(self.low_to_high(low), size=high.shape[-2:], mode="nearest")
        down = F.adaptive_avg_pool2d(self.high_to_low(high), low.shape[-2:])
        return high + up * 0.3, low + down * 0.3


class Encoder(nn.Module):
    def __init__(self, cfg: ZipDepthConfig):
        super().__init__()
        d = cfg.dims
        self.stem_half = ConvBNReLU(3, d[0] // 2, 3, 2)
        self.stem_quarter = ConvBNReLU(d[0] // 2, d[0], 3, 2)
        self.stage1 = nn.Sequential(*[RepBlock(d[0], d[0]) for _ in range(cfg.depths[0])])
        self.down2 = RepBlock(d[0], d[1], 2)
        self.stage2 = nn.Sequential(*[RepBlock(d[1], d[1]) for _ in range(cfg.depths[1])],
                                    MultiDilation(d[1]), StripGate(d[1]))
        self.down3 = RepBlock(d[1], d[2], 2)
        self.stage3 = nn.Sequential(*[RepBlock(d[2], d[2]) for _ in range(cfg.depths[2])],
                                    SqueezeExcite(d[2]), GlobalContext(d[2]))
        self.down4 = RepBlock(d[2], d[3], 2)
        self.stage4 = nn.Sequential(*[RepBlock(d[3], d[3]) for _ in range(cfg.depths[3])])
        self.spp = LightSPPF(d[3], d[3])
        self.cross_scale = CrossScale(d[2], d[3])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        half = self.stem_half(x)
        s1 = self.stage1(self.stem_quarter(half))
        s2 = self.stage2(self.down2(s1))
        s3 = self.stage3(self.down3(s2))
        s4 = self.spp(self.stage4(self.down4(s3)))
        s3, s4 = self.cross_scale(s3, s4)
        return half, [s1, s2, s3, s4]


class Fuse(nn.Module):
    """ReLU(BN(grouped 1x1 of the finer map + grouped 1x1 of the coarser one, bilinearly
    upsampled to the finer grid, align_corners=False))."""

    def __init__(self, c_high: int, c_low: int, c_out: int):
        super().__init__()
        self.proj_high = nn.Conv2d(c_high, c_out, 1, groups=_groups(c_high, c_out), bias=False)
        self.proj_low = nn.Conv2d(c_low, c_out, 1, groups=_groups(c_low, c_out), bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        low = F.interpolate(low, size=high.shape[-2:], mode="bilinear", align_corners=False)
        return F.relu(self.bn(self.proj_high(high) + self.proj_low(low)))


class ConvexUpsample(nn.Module):
    """2x convex upsampling (RAFT): ``mask_pred`` gives, per half-resolution pixel, 9 logits for
    each of the 2 x 2 output sub-pixels; their softmax over the 9 weights the replicate-padded
    3x3 neighbourhood of the depth map; the sub-pixels are laid out by a pixel shuffle."""

    def __init__(self, c: int, scale: int = 2):
        super().__init__()
        self.scale = scale
        hidden = max(c // 4, 8)
        self.mask_pred = nn.Sequential(nn.Conv2d(c, hidden, 3, 1, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU(),
                                       nn.Conv2d(hidden, 9 * scale * scale, 1))

    def forward(self, feat: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        b, _, h, w = depth.shape
        s = self.scale
        weights = self.mask_pred(feat).view(b, 9, s * s, h, w).softmax(1)
        taps = F.unfold(F.pad(depth, (1, 1, 1, 1), mode="replicate"), 3).view(b, 9, 1, h, w)
        return F.pixel_shuffle((weights * taps).sum(1), s)


class Decoder(nn.Module):
    def __init__(self, cfg: ZipDepthConfig):
        super().__init__()
        c1, c2, c3, c4 = cfg.dims
        ch1, ch2, ch3, ch4 = cfg.dec_ch, int(cfg.dec_ch * 1.5), cfg.dec_ch * 2, cfg.dec_ch * 3
        self.proj4 = ConvBNReLU(c4, ch4)
        self.fuse3 = Fuse(c3, ch4, ch3)
        self.fuse2 = Fuse(c2, ch3, ch2)
        self.fuse1 = Fuse(c1, ch2, ch1)
        self.fuse_half = Fuse(c1 // 2, ch1, cfg.half_dec_ch)
        self.head_half = nn.Conv2d(cfg.half_dec_ch, 1, 3, 1, 1)
        self.convex_up = ConvexUpsample(cfg.half_dec_ch)
        # upstream's initialisation of the head: a positive start, clear of the final ReLU
        nn.init.kaiming_normal_(self.head_half.weight, mode="fan_out", nonlinearity="relu")
        nn.init.constant_(self.head_half.bias, 0.5)

    def forward(self, half: torch.Tensor, feats: list[torch.Tensor]) -> torch.Tensor:
        s1, s2, s3, s4 = feats
        f = self.fuse1(s1, self.fuse2(s2, self.fuse3(s3, self.proj4(s4))))
        f = self.fuse_half(half, f)
        return F.relu(self.convex_up(f, self.head_half(f)))


class ZipDepthNet(nn.Module):
    """(B, 3, H, W) RGB in [0, 1], H and W multiples of 32 -> (B, 1, H, W) relative inverse depth."""

    def __init__(self, size: str = "b", cfg: ZipDepthConfig | None = None):
        super().__init__()
        if cfg is None:
            if size not in CONFIGS:
                raise ValueError(f"unknown ZipDepth size {size!r}; sizes: {', '.join(CONFIGS)}")
            cfg = CONFIGS[size]
        self.cfg = cfg
        # persistent, as in the checkpoints (the fixture lists them as constants)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[-2]), int(x.shape[-1])
        if h % STRIDE or w % STRIDE:
            raise ValueError(f"ZipDepth needs an input whose height and width are multiples of {STRIDE}, "
                             f"got {h}x{w}")
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        half, feats = self.encoder(x)
        return self.decoder(half, feats)

    def fuse(self) -> ZipDepthNet:
        """Inference form, in place: every :class:`RepBlock` one 3x3 conv, every
        :class:`ConvBNReLU`'s BatchNorm folded (same function up to float32 rounding)."""
        for m in list(self.modules()):
            if isinstance(m, (RepBlock, ConvBNReLU)):
                m.fuse()
        return self
