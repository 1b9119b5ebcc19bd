"""Real-ESRGAN's two generators (Wang et al., 2021; architectures from BasicSR, Apache-2.0), in the
LibreYOLO layout (upstream's module names, so the released weights load key for key):

* :class:`RRDBNet` - residual-in-residual dense blocks (ESRGAN's generator): sizes ``x4``
  (RealESRGAN_x4plus) and ``x2`` (RealESRGAN_x2plus, which pixel-unshuffles its input by 2 so the
  trunk still upsamples 4x);
* :class:`SRVGGNetCompact` - a plain conv / PReLU body whose last conv feeds a PixelShuffle, plus
  the nearest-upsampled input as a global residual: size ``x4t`` (realesr-general-x4v3, the fast tier).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: size -> the generator and its settings (the reference's)
CONFIGS: dict[str, dict] = {
    "x4": {"arch": "rrdb", "scale": 4, "num_feat": 64, "num_block": 23, "num_grow_ch": 32},
    "x2": {"arch": "rrdb", "scale": 2, "num_feat": 64, "num_block": 23, "num_grow_ch": 32},
    "x4t": {"arch": "srvgg", "scale": 4, "num_feat": 64, "num_conv": 32},
}


class ResidualDenseBlock(nn.Module):
    """Five densely connected 3x3 convs; the block's output scaled by 0.2 onto its input."""

    def __init__(self, num_feat: int = 64, num_grow_ch: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(num_feat, num_grow_ch, 3, 1, 1)
        self.conv2 = nn.Conv2d(num_feat + num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv3 = nn.Conv2d(num_feat + 2 * num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv4 = nn.Conv2d(num_feat + 3 * num_grow_ch, num_grow_ch, 3, 1, 1)
        self.conv5 = nn.Conv2d(num_feat + 4 * num_grow_ch, num_feat, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * 0.2 + x


class RRDB(nn.Module):
    """Three residual dense blocks, their output scaled by 0.2 onto the input."""

    def __init__(self, num_feat: int, num_grow_ch: int = 32):
        super().__init__()
        self.rdb1 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb2 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb3 = ResidualDenseBlock(num_feat, num_grow_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    """ESRGAN's generator: conv, ``num_block`` RRDBs and a conv as one residual, two nearest 2x
    upsamplings each followed by a conv, then two convs. ``scale`` 2 pixel-unshuffles the input
    by 2 first (its H and W must be even), so the output is ``scale`` times the input."""

    def __init__(self, scale: int = 4, num_feat: int = 64, num_block: int = 23, num_grow_ch: int = 32):
        super().__init__()
        if scale not in (2, 4):
            raise ValueError(f"RRDBNet upscales 2x or 4x, got {scale}")
        self.scale = scale
        self.conv_first = nn.Conv2d(3 * (16 // scale ** 2), num_feat, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(num_feat, num_grow_ch) for _ in range(num_block)])
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, 3, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale == 2:
            if x.shape[-2] % 2 or x.shape[-1] % 2:
                raise ValueError(f"Real-ESRGAN x2 takes inputs of even height and width, got "
                                 f"{tuple(x.shape[-2:])}")
            x = F.pixel_unshuffle(x, 2)
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        feat = self.lrelu(self.conv_up1(F.interpolate(feat, scale_factor=2.0, mode="nearest")))
        feat = self.lrelu(self.conv_up2(F.interpolate(feat, scale_factor=2.0, mode="nearest")))
        return self.conv_last(self.lrelu(self.conv_hr(feat)))


class SRVGGNetCompact(nn.Module):
    """realesr-general-x4v3's compact network: conv + PReLU, ``num_conv`` x (conv + PReLU), a conv
    to 3 * upscale^2 channels, PixelShuffle, plus the nearest-upsampled input."""

    def __init__(self, num_feat: int = 64, num_conv: int = 32, upscale: int = 4):
        super().__init__()
        self.upscale = upscale
        self.body = nn.ModuleList([nn.Conv2d(3, num_feat, 3, 1, 1), nn.PReLU(num_feat)])
        for _ in range(num_conv):
            self.body.extend([nn.Conv2d(num_feat, num_feat, 3, 1, 1), nn.PReLU(num_feat)])
        self.body.append(nn.Conv2d(num_feat, 3 * upscale * upscale, 3, 1, 1))
        self.upsampler = nn.PixelShuffle(upscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for layer in self.body:
            out = layer(out)
        return self.upsampler(out) + F.interpolate(x, scale_factor=float(self.upscale), mode="nearest")


def build(size: str) -> nn.Module:
    """The generator of ``size`` (``x4``, ``x2``, ``x4t``)."""
    if size not in CONFIGS:
        raise ValueError(f"unknown Real-ESRGAN size {size!r}; sizes: {', '.join(CONFIGS)}")
    c = CONFIGS[size]
    if c["arch"] == "rrdb":
        return RRDBNet(c["scale"], c["num_feat"], c["num_block"], c["num_grow_ch"])
    return SRVGGNetCompact(c["num_feat"], c["num_conv"], c["scale"])
