"""PicoDet network (ESNet backbone, CSP-PAN neck with a fourth level, GFL head).

Layout follows the LibreYOLO checkpoints: ``backbone.conv1`` / ``backbone.blocks.*``,
``neck.trans`` / ``first_top_conv`` / ``second_top_conv`` / ``top_down_blocks`` /
``downsamples`` / ``bottom_up_blocks`` and ``head.cls_convs`` / ``head.gfl_cls``.
Size s is pinned by the architecture fixture; m and l use the ESNet scales and channel
ratios of the original PicoDet-M / PicoDet-L configurations.

Activations: hard-swish everywhere, ReLU inside the squeeze-excitation bottleneck and a
hard sigmoid gate ``clamp((x + 3) / 6, 0, 6)`` (the upper bound of 6, not 1, is what the
original checkpoints were trained with). BatchNorm uses PyTorch's defaults (eps 1e-5).

``forward`` returns ``(cls_scores, bbox_preds)`` for strides 8, 16, 32, 64: class logits
(B, nc, H/s, W/s) and box-distribution logits (B, 4 * (REG_MAX + 1), H/s, W/s), 8 bins for
left, then top, right, bottom.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.blocks import ConvBN, fuse_modules

STRIDES = (8, 16, 32, 64)
REG_MAX = 7


@dataclass(frozen=True)
class PicodetConfig:
    scale: float                    # ESNet width multiplier
    ratios: tuple[float, ...]       # per backbone block: hidden width / block output width
    width: int                      # neck and head channels
    stacked: int                    # depthwise-separable convs per head tower


_RATIOS_ML = (0.875, 0.5, 1.0, 0.625, 0.5, 0.75, 0.625, 0.625, 0.5, 0.625, 1.0, 0.625, 0.75)
CONFIGS: dict[str, PicodetConfig] = {
    "s": PicodetConfig(0.75, (0.875, 0.5, 0.5, 0.5, 0.625, 0.5, 0.625, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5),
                       96, 2),
    "m": PicodetConfig(1.0, _RATIOS_ML, 128, 4),
    "l": PicodetConfig(1.25, _RATIOS_ML, 160, 4),
}
STAGE_REPEATS = (3, 7, 3)


def _round_to(v: float, divisor: int) -> int:
    """Nearest multiple of ``divisor`` (at least ``divisor``), bumped up if it loses > 10%."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


class CBH(ConvBN):
    """Conv (no bias) -> BatchNorm (eps 1e-5) -> hard-swish, or no activation."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True):
        super().__init__(c_in, c_out, k, s, None, g, act)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.Hardswish() if act else nn.Identity()


class DWSep(nn.Module):
    """Depthwise k x k (stride s) and pointwise 1x1, each with BN and hard-swish."""

    def __init__(self, c_in: int, c_out: int, k: int = 5, s: int = 1):
        super().__init__()
        self.depthwise_conv = CBH(c_in, c_in, k, s, g=c_in)
        self.pointwise_conv = CBH(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class SqueezeExcite(nn.Module):
    """Global mean -> 1x1 (ReLU) -> 1x1 -> clamp((v + 3) / 6, 0, 6) gate."""

    def __init__(self, c: int, ratio: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // ratio, 1)
        self.conv2 = nn.Conv2d(c // ratio, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.conv2(F.relu(self.conv1(x.mean((2, 3), keepdim=True))))
        return x * ((g + 3.0) / 6.0).clamp(0.0, 6.0)


class ESUnit(nn.Module):
    """Stride-1 ES block: keep half the channels, transform the other half, shuffle."""

    def __init__(self, c: int, mid: int):
        super().__init__()
        h = mid // 2
        self.conv_pw = CBH(c // 2, h, 1)
        self.conv_dw = CBH(h, h, 3, g=h, act=False)
        self.se = SqueezeExcite(mid)
        self.conv_linear = CBH(mid, c // 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep, work = x.chunk(2, 1)
        a = self.conv_pw(work)
        y = self.conv_linear(self.se(torch.cat((a, self.conv_dw(a)), 1)))
        out = torch.cat((keep, y), 1)
        b, c, hh, ww = out.shape
        return out.view(b, 2, c // 2, hh, ww).transpose(1, 2).reshape(b, c, hh, ww)


class ESDown(nn.Module):
    """Stride-2 ES block: two downsampling branches, concatenated, then dw 3x3 + pw 1x1."""

    def __init__(self, c_in: int, mid: int, c_out: int):
        super().__init__()
        h = mid // 2
        self.conv_dw_1 = CBH(c_in, c_in, 3, 2, g=c_in, act=False)
        self.conv_linear_1 = CBH(c_in, c_out // 2, 1)
        self.conv_pw_2 = CBH(c_in, h, 1)
        self.conv_dw_2 = CBH(h, h, 3, 2, g=h, act=False)
        self.se = SqueezeExcite(h)
        self.conv_linear_2 = CBH(h, c_out // 2, 1)
        self.conv_dw_mv1 = CBH(c_out, c_out, 3, g=c_out)
        self.conv_pw_mv1 = CBH(c_out, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv_linear_1(self.conv_dw_1(x))
        b = self.conv_linear_2(self.se(self.conv_dw_2(self.conv_pw_2(x))))
        return self.conv_pw_mv1(self.conv_dw_mv1(torch.cat((a, b), 1)))


class ESNet(nn.Module):
    """Backbone; returns the outputs of the last block of each stage (strides 8, 16, 32)."""

    def __init__(self, cfg: PicodetConfig):
        super().__init__()
        chans = [24] + [_round_to(c * cfg.scale, 16) for c in (128, 256, 512)]
        self.out_channels = tuple(chans[1:])
        self.conv1 = CBH(3, chans[0], 3, 2)
        self.blocks = nn.ModuleList()
        taps, i = [], 0
        for stage, reps in enumerate(STAGE_REPEATS):
            c_in, c_out = chans[stage], chans[stage + 1]
            for r in range(reps):
                mid = _round_to(int(c_out * cfg.ratios[i]), 8)
                self.blocks.append(ESDown(c_in, mid, c_out) if r == 0 else ESUnit(c_out, mid))
                i += 1
            taps.append(i - 1)
        self.taps = tuple(taps)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = F.max_pool2d(self.conv1(x), 3, 2, 1)
        outs = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.taps:
                outs.append(x)
        return outs


class Bottleneck(nn.Module):
    """1x1 conv then a 5x5 depthwise-separable conv (no residual in PicoDet's neck)."""

    def __init__(self, c: int, k: int = 5):
        super().__init__()
        self.conv1 = CBH(c, c, 1)
        self.conv2 = DWSep(c, c, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class CSP(nn.Module):
    """CSP layer: two 1x1 halves, one through a Bottleneck, concat (main first), 1x1 out."""

    def __init__(self, c_in: int, c_out: int, n: int = 1):
        super().__init__()
        mid = c_out // 2
        self.main_conv = CBH(c_in, mid, 1)
        self.short_conv = CBH(c_in, mid, 1)
        self.final_conv = CBH(2 * mid, c_out, 1)
        self.blocks = nn.Sequential(*[Bottleneck(mid) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_conv(torch.cat((self.blocks(self.main_conv(x)), self.short_conv(x)), 1))


class CSPPAN(nn.Module):
    """1x1 projections, top-down and bottom-up CSP fusion, plus a stride-64 extra level."""

    def __init__(self, chans: tuple[int, int, int], c: int):
        super().__init__()
        self.trans = nn.ModuleList([CBH(ci, c, 1) for ci in chans])
        self.first_top_conv = DWSep(c, c, 5, 2)
        self.second_top_conv = DWSep(c, c, 5, 2)
        self.top_down_blocks = nn.ModuleList([CSP(2 * c, c) for _ in range(2)])
        self.downsamples = nn.ModuleList([DWSep(c, c, 5, 2) for _ in range(2)])
        self.bottom_up_blocks = nn.ModuleList([CSP(2 * c, c) for _ in range(2)])

    @staticmethod
    def _up_to(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        if x.shape[-2:] != ref.shape[-2:]:   # odd input sizes (static shapes, no host sync)
            x = F.interpolate(x, size=ref.shape[-2:], mode="nearest")
        return x

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        f3, f4, f5 = (t(f) for t, f in zip(self.trans, feats))
        t4 = self.top_down_blocks[0](torch.cat((self._up_to(f5, f4), f4), 1))
        p3 = self.top_down_blocks[1](torch.cat((self._up_to(t4, f3), f3), 1))
        p4 = self.bottom_up_blocks[0](torch.cat((self.downsamples[0](p3), t4), 1))
        p5 = self.bottom_up_blocks[1](torch.cat((self.downsamples[1](p4), f5), 1))
        p6 = self.first_top_conv(f5) + self.second_top_conv(p5)
        return [p3, p4, p5, p6]


class GFLHead(nn.Module):
    """Per-level tower of depthwise-separable convs and one 1x1 conv predicting classes and
    box distributions together (split after the conv). ``reg_convs`` holds no weights."""

    def __init__(self, nc: int, c: int, stacked: int):
        super().__init__()
        self.nc = nc
        self.cls_convs = nn.ModuleList(
            [nn.ModuleList([DWSep(c, c, 5) for _ in range(stacked)]) for _ in STRIDES])
        self.reg_convs = nn.ModuleList([nn.ModuleList() for _ in STRIDES])
        self.gfl_cls = nn.ModuleList([nn.Conv2d(c, nc + 4 * (REG_MAX + 1), 1) for _ in STRIDES])

    def forward(self, feats: list[torch.Tensor]):
        cls_out, box_out = [], []
        for tower, pred, f in zip(self.cls_convs, self.gfl_cls, feats):
            for layer in tower:
                f = layer(f)
            y = pred(f)
            cls_out.append(y[:, :self.nc])
            box_out.append(y[:, self.nc:])
        return tuple(cls_out), tuple(box_out)


class PicodetNet(nn.Module):
    """The whole detector; ``forward`` returns ``(cls_scores, bbox_preds)`` per level."""

    def __init__(self, size: str = "s", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown PicoDet size {size!r}; sizes: {', '.join(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        self.backbone = ESNet(cfg)
        self.neck = CSPPAN(self.backbone.out_channels, cfg.width)
        self.head = GFLHead(nc, cfg.width, cfg.stacked)

    def forward(self, x: torch.Tensor):
        return self.head(self.neck(self.backbone(x)))

    def fuse(self) -> PicodetNet:
        """Fold every BatchNorm into its convolution (inference only)."""
        return fuse_modules(self)
