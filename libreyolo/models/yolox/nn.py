"""YOLOX network in the LibreYOLO checkpoint layout.

Layout (the attribute names are the checkpoint keys and must not change):
``backbone.backbone.*`` is the CSP-Darknet trunk (Focus ``stem``, ``dark2``..``dark5``),
``backbone.{lateral_conv0, C3_p4, reduce_conv1, C3_p3, bu_conv2, C3_n3, bu_conv1, C3_n4}``
is the PAFPN neck, and ``head.{cls_convs, reg_convs, cls_preds, reg_preds, obj_preds, stems}``
is the decoupled head. Every conv block is Conv -> BatchNorm(eps 1e-3, momentum 0.03) -> SiLU,
i.e. the shared :class:`ConvBN`. Size n replaces the 3x3 convs (downsamples, bottlenecks,
head towers) by a depthwise 3x3 + pointwise 1x1 pair (``dconv`` / ``pconv``).

``forward`` returns a list of three per-level maps (strides 8, 16, 32), each
``(B, 5 + nc, H/s, W/s)``: raw box regression (tx, ty, tw, th), sigmoid objectness, sigmoid
class probabilities. Decoding into pixels happens in :func:`decode`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.assign import cached, join_levels, prior_grid
from ..common.blocks import ConvBN, fuse_modules

STRIDES = (8, 16, 32)


@dataclass(frozen=True)
class YoloxConfig:
    depth: float       # depth multiplier (number of bottlenecks)
    width: float       # width multiplier (channels)
    depthwise: bool    # depthwise-separable 3x3 convs (nano)


CONFIGS: dict[str, YoloxConfig] = {
    "n": YoloxConfig(0.33, 0.25, True),
    "t": YoloxConfig(0.33, 0.375, False),
    "s": YoloxConfig(0.33, 0.50, False),
    "m": YoloxConfig(0.67, 0.75, False),
    "l": YoloxConfig(1.00, 1.00, False),
    "x": YoloxConfig(1.33, 1.25, False),
}


class SeparableConv(nn.Module):
    """Depthwise k x k ConvBN (with stride) followed by a pointwise 1x1 ConvBN."""

    def __init__(self, c_in: int, c_out: int, k: int = 3, s: int = 1):
        super().__init__()
        self.dconv = ConvBN(c_in, c_in, k, s, g=c_in)
        self.pconv = ConvBN(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


def _conv3(depthwise: bool, c_in: int, c_out: int, s: int = 1) -> nn.Module:
    """The 3x3 block of this size: plain ConvBN, or the separable pair for nano."""
    return SeparableConv(c_in, c_out, 3, s) if depthwise else ConvBN(c_in, c_out, 3, s)


class Bottleneck(nn.Module):
    """1x1 ConvBN then 3x3 block, with a residual add when enabled and shapes match."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool, depthwise: bool):
        super().__init__()
        self.conv1 = ConvBN(c_in, c_out, 1)
        self.conv2 = _conv3(depthwise, c_out, c_out)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class CSPLayer(nn.Module):
    """Two 1x1 halves; the first runs through ``n`` bottlenecks; concatenated and fused by 1x1."""

    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool, depthwise: bool):
        super().__init__()
        hidden = c_out // 2
        self.conv1 = ConvBN(c_in, hidden, 1)
        self.conv2 = ConvBN(c_in, hidden, 1)
        self.conv3 = ConvBN(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*[Bottleneck(hidden, hidden, shortcut, depthwise) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), 1))


class SPPBottleneck(nn.Module):
    """1x1 halve, parallel stride-1 max-pools (5, 9, 13) concatenated with the input, 1x1 out."""

    def __init__(self, c_in: int, c_out: int, kernels: tuple[int, ...] = (5, 9, 13)):
        super().__init__()
        hidden = c_in // 2
        self.conv1 = ConvBN(c_in, hidden, 1)
        self.kernels = kernels
        self.conv2 = ConvBN(hidden * (len(kernels) + 1), c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        pooled = [F.max_pool2d(x, k, 1, k // 2) for k in self.kernels]
        return self.conv2(torch.cat([x, *pooled], 1))


class Focus(nn.Module):
    """Space-to-depth (2x2 pixel blocks -> channels) followed by a 3x3 ConvBN."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = ConvBN(4 * c_in, c_out, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # channel-block order: (even row, even col), (odd row, even col),
        # (even row, odd col), (odd row, odd col)
        x = torch.cat((x[..., 0::2, 0::2], x[..., 1::2, 0::2],
                       x[..., 0::2, 1::2], x[..., 1::2, 1::2]), 1)
        return self.conv(x)


class CSPDarknet(nn.Module):
    """Trunk: Focus stem then four stride-2 stages; returns the dark3/dark4/dark5 features."""

    def __init__(self, cfg: YoloxConfig):
        super().__init__()
        c = int(cfg.width * 64)
        d = max(round(cfg.depth * 3), 1)
        dw = cfg.depthwise
        self.stem = Focus(3, c)
        self.dark2 = nn.Sequential(_conv3(dw, c, 2 * c, 2), CSPLayer(2 * c, 2 * c, d, True, dw))
        self.dark3 = nn.Sequential(_conv3(dw, 2 * c, 4 * c, 2), CSPLayer(4 * c, 4 * c, 3 * d, True, dw))
        self.dark4 = nn.Sequential(_conv3(dw, 4 * c, 8 * c, 2), CSPLayer(8 * c, 8 * c, 3 * d, True, dw))
        self.dark5 = nn.Sequential(_conv3(dw, 8 * c, 16 * c, 2), SPPBottleneck(16 * c, 16 * c),
                                   CSPLayer(16 * c, 16 * c, d, False, dw))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.dark2(self.stem(x))
        p3 = self.dark3(x)
        p4 = self.dark4(p3)
        p5 = self.dark5(p4)
        return p3, p4, p5


class PAFPN(nn.Module):
    """Trunk plus a top-down then bottom-up path aggregation neck (outputs P3, P4, P5)."""

    def __init__(self, cfg: YoloxConfig):
        super().__init__()
        c3, c4, c5 = (int(ch * cfg.width) for ch in (256, 512, 1024))
        n = round(3 * cfg.depth)
        dw = cfg.depthwise
        self.backbone = CSPDarknet(cfg)
        self.lateral_conv0 = ConvBN(c5, c4, 1)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, False, dw)
        self.reduce_conv1 = ConvBN(c4, c3, 1)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, False, dw)
        self.bu_conv2 = _conv3(dw, c3, c3, 2)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, False, dw)
        self.bu_conv1 = _conv3(dw, c4, c4, 2)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, False, dw)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p3, p4, p5 = self.backbone(x)
        top5 = self.lateral_conv0(p5)
        mid4 = self.C3_p4(torch.cat((F.interpolate(top5, scale_factor=2.0, mode="nearest"), p4), 1))
        top4 = self.reduce_conv1(mid4)
        out3 = self.C3_p3(torch.cat((F.interpolate(top4, scale_factor=2.0, mode="nearest"), p3), 1))
        out4 = self.C3_n3(torch.cat((self.bu_conv2(out3), top4), 1))
        out5 = self.C3_n4(torch.cat((self.bu_conv1(out4), top5), 1))
        return out3, out4, out5


class DecoupledHead(nn.Module):
    """Per level: 1x1 stem, then a class tower and a box tower (two 3x3 blocks each).

    The class tower feeds ``cls_preds``; the box tower feeds ``reg_preds`` and ``obj_preds``.
    """

    def __init__(self, cfg: YoloxConfig, nc: int):
        super().__init__()
        hidden = int(256 * cfg.width)
        ins = [int(ch * cfg.width) for ch in (256, 512, 1024)]
        dw = cfg.depthwise
        # Creation order fixes the checkpoint key order: towers, predictors, then stems.
        self.cls_convs = nn.ModuleList(
            nn.Sequential(_conv3(dw, hidden, hidden), _conv3(dw, hidden, hidden)) for _ in ins)
        self.reg_convs = nn.ModuleList(
            nn.Sequential(_conv3(dw, hidden, hidden), _conv3(dw, hidden, hidden)) for _ in ins)
        self.cls_preds = nn.ModuleList(nn.Conv2d(hidden, nc, 1) for _ in ins)
        self.reg_preds = nn.ModuleList(nn.Conv2d(hidden, 4, 1) for _ in ins)
        self.obj_preds = nn.ModuleList(nn.Conv2d(hidden, 1, 1) for _ in ins)
        self.stems = nn.ModuleList(ConvBN(c, hidden, 1) for c in ins)

    def forward(self, feats) -> list[torch.Tensor]:
        out = []
        for i, f in enumerate(feats):
            f = self.stems[i](f)
            cls_feat = self.cls_convs[i](f)
            reg_feat = self.reg_convs[i](f)
            if self.training:
                out.append(torch.cat((self.reg_preds[i](reg_feat), self.obj_preds[i](reg_feat),
                                      self.cls_preds[i](cls_feat)), 1))
            else:
                out.append(torch.cat((self.reg_preds[i](reg_feat), self.obj_preds[i](reg_feat).sigmoid(),
                                      self.cls_preds[i](cls_feat).sigmoid()), 1))
        return out


class YoloxNet(nn.Module):
    """YOLOX for one size: ``backbone`` (trunk + PAFPN) and ``head``.

    Input: (B, 3, H, W) BGR on a 0-255 scale, H and W multiples of 32. Output: list of three
    ``(B, 5 + nc, H/s, W/s)`` maps; in eval mode objectness and class channels are sigmoided
    (in train mode all channels are logits).
    """

    def __init__(self, size: str = "s", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown YOLOX size {size!r}; sizes: {', '.join(CONFIGS)}")
        self.size = size
        self.nc = int(nc)
        cfg = CONFIGS[size]
        self.backbone = PAFPN(cfg)
        self.head = DecoupledHead(cfg, self.nc)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.head(self.backbone(x))

    def fuse(self) -> YoloxNet:
        """Fold every BatchNorm into its convolution (inference only)."""
        fuse_modules(self)
        return self


#: per input size: cell indices (1, N, 2), strides and half strides (1, N, 1)
_GRIDS: dict = {}


def decode(maps: list[torch.Tensor], strides=STRIDES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eval-mode head maps -> boxes (B, N, 4) xyxy in input pixels, best score (B, N), class (B, N).

    Per cell: centre = (t_xy + cell index) * stride, size = exp(t_wh) * stride,
    score = objectness * class probability. Fixed shapes, no host synchronisation. The levels
    are joined first and decoded as one (cell indices and strides per anchor, cached per input
    size): about ten kernels instead of thirty, and the same numbers as level by level (the
    strides are powers of two, so every product and quotient is exact in either form).
    """
    m0 = maps[0]
    hw = tuple(tuple(m.shape[-2:]) for m in maps)

    def build():
        grid, stride = prior_grid(hw, strides, 0.0, False, m0.dtype, m0.device)
        return grid[None], stride[None], stride[None] / 2

    grid, stride, half_stride = cached(_GRIDS, (hw, tuple(strides), m0.dtype, m0.device), build)
    p = join_levels(maps)                                                   # (B, N, 5+nc)
    xy = (p[..., 0:2] + grid) * stride
    half = torch.exp(p[..., 2:4]) * half_stride
    score, cls = (p[..., 4:5] * p[..., 5:]).max(-1)
    return torch.cat((xy - half, xy + half), -1), score, cls
