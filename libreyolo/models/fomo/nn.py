"""FOMO network ("Faster Objects, More Objects", Edge Impulse's centroid detector for
microcontrollers) in the LibreYOLO 1.6.0 checkpoint layout (``LibreFOMO``).

The backbone is Keras' MobileNetV2 (width multiplier ``alpha``) cut after ``block_6_expand_relu``,
the first layer at 1/8 of the input; the head is one 1x1 convolution to ``1 + nc`` logits per
cell (channel 0 background, then one per class). Module names follow the Keras layer names:

* ``conv1``: 3x3 stride-2 convolution, BatchNorm, ReLU6;
* ``expanded_conv``: the expansion-1 inverted residual (depthwise 3x3, BN, ReLU6; 1x1 project, BN);
* ``block_1`` ... ``block_5``: inverted residuals of expansion 6 (1x1 expand, BN, ReLU6; depthwise
  3x3, BN, ReLU6; 1x1 project, BN), strides 2, 1, 2, 1, 1, with the identity added where input
  and output agree (blocks 2, 4, 5);
* ``block_6_expand``: the next block's 1x1 expansion (BN, ReLU6) - its output is the feature map;
* ``head``: 1x1 convolution with bias.

Every BatchNorm has Keras' eps 1e-3. The convolutions pad as TensorFlow's ``"same"`` does: the
total padding a stride-2 layer needs goes mostly after (right / bottom), so a stride-2 3x3 on an
even side pads 0 before and 1 after (PyTorch's ``padding=1`` would shift the sampling grid by
one pixel). The padding is computed from the input's static size (no host sync); at sides that
are multiples of 8 - the family's stride - it equals the fixed padding the reference computes
for its native input size. Widths round as Keras' ``_make_divisible`` does (multiples of 8,
never more than 10 % below the scaled width).

Sizes, as LibreYOLO 1.6.0 defines them: s (alpha 0.35, 96 px), m (alpha 0.5, 192 px),
l (alpha 1.0, 224 px); s and m end in 96 channels, l in 192.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: the output's cell size in input pixels (three stride-2 layers)
STRIDE = 8
#: Keras' BatchNorm epsilon
BN_EPS = 1e-3


@dataclass(frozen=True)
class FomoConfig:
    alpha: float   # MobileNetV2 width multiplier
    imgsz: int     # the input side the size is trained at


CONFIGS: dict[str, FomoConfig] = {
    "s": FomoConfig(0.35, 96),
    "m": FomoConfig(0.50, 192),
    "l": FomoConfig(1.00, 224),
}


def make_divisible(v: float, divisor: int = 8) -> int:
    """Keras' MobileNetV2 width rounding: the nearest multiple of ``divisor`` (at least one),
    bumped up by one multiple when rounding lost more than 10 %."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's ``"same"`` padding of one side: (before, after), the extra pixel after."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class SameConv(nn.Module):
    """A bias-free convolution with TensorFlow's "same" padding (``conv`` holds the weights)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, 0, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel > 1:
            top, bottom = same_padding(int(x.shape[-2]), self.kernel, self.stride)
            left, right = same_padding(int(x.shape[-1]), self.kernel, self.stride)
            x = F.pad(x, (left, right, top, bottom))
        return self.conv(x)


def conv_bn_relu6(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    """Keras' Conv2D / DepthwiseConv2D + BatchNormalization + ReLU6 (``0.conv``, ``1``, ``2``)."""
    return nn.Sequential(SameConv(c_in, c_out, kernel, stride, groups), nn.BatchNorm2d(c_out, eps=BN_EPS),
                         nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: [1x1 expand, BN, ReLU6] (expansion > 1), depthwise 3x3, BN, ReLU6,
    1x1 project, BN (linear); the input added back when ``residual``."""

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int, residual: bool):
        super().__init__()
        hidden = int(round(c_in * expansion))
        layers = [conv_bn_relu6(c_in, hidden, 1)] if expansion != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Sequential(nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out, eps=BN_EPS))]
        self.conv = nn.Sequential(*layers)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.residual else out


class FomoBackbone(nn.Module):
    """MobileNetV2 (``alpha``) up to ``block_6_expand``: (B, 3, H, W) -> (B, C, H/8, W/8)."""

    def __init__(self, alpha: float):
        super().__init__()
        c0, c1 = make_divisible(32 * alpha), make_divisible(16 * alpha)
        c2, c3 = make_divisible(24 * alpha), make_divisible(32 * alpha)
        self.conv1 = conv_bn_relu6(3, c0, 3, 2)
        self.expanded_conv = InvertedResidual(c0, c1, 1, 1, residual=False)
        self.block_1 = InvertedResidual(c1, c2, 2, 6, residual=False)
        self.block_2 = InvertedResidual(c2, c2, 1, 6, residual=True)
        self.block_3 = InvertedResidual(c2, c3, 2, 6, residual=False)
        self.block_4 = InvertedResidual(c3, c3, 1, 6, residual=True)
        self.block_5 = InvertedResidual(c3, c3, 1, 6, residual=True)
        self.block_6_expand = conv_bn_relu6(c3, c3 * 6, 1)
        self.out_channels = c3 * 6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in (self.conv1, self.expanded_conv, self.block_1, self.block_2, self.block_3, self.block_4,
                  self.block_5, self.block_6_expand):
            x = m(x)
        return x


class FomoNet(nn.Module):
    """FOMO: (B, 3, H, W) normalized RGB ([-1, 1]) -> (B, 1 + nc, H/8, W/8) centroid-map logits
    (channel 0 background, channel 1 + c class c; before the softmax)."""

    def __init__(self, size: str, nc: int = 1):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown FOMO size {size!r}; sizes: {', '.join(CONFIGS)}")
        self.size, self.nc = size, int(nc)
        self.backbone = FomoBackbone(CONFIGS[size].alpha)
        self.head = nn.Conv2d(self.backbone.out_channels, 1 + self.nc, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] % STRIDE or x.shape[-1] % STRIDE:
            raise ValueError(f"FOMO takes inputs whose sides are multiples of {STRIDE}, got "
                             f"{x.shape[-2]}x{x.shape[-1]}")
        return self.head(self.backbone(x))
