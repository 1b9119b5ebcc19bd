"""ResNet-vd backbone ("PResNet"), as used by RT-DETR and RT-DETRv2.

The "d" variant: a stem of three 3x3 ConvNorms (stride 2 on the first) followed by a 3x3 max
pool, and downsampling shortcuts that average-pool 2x2 before their 1x1 conv. Returns the
stride-8, -16 and -32 feature maps. Checkpoint layout: ``conv1.conv1_{1,2,3}``,
``res_layers.{i}.blocks.{j}.{short, branch2a, branch2b[, branch2c]}``.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from .layers import ConvNorm, activation

STAGE_WIDTHS = (64, 128, 256, 512)


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    """Projection shortcut; with stride 2 it average-pools first (the "d" variant)."""
    if stride == 2:
        return nn.Sequential(OrderedDict([("pool", nn.AvgPool2d(2, 2, 0, ceil_mode=True)),
                                          ("conv", ConvNorm(c_in, c_out, 1, 1))]))
    return ConvNorm(c_in, c_out, 1, stride)


class BasicBlock(nn.Module):
    """Two 3x3 ConvNorms plus an identity or projection shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, c_in: int, c_out: int, stride: int, project: bool, act: str = "relu"):
        super().__init__()
        if project:  # registered first: it precedes the branches in the checkpoint
            self.short = _shortcut(c_in, c_out, stride)
        self.branch2a = ConvNorm(c_in, c_out, 3, stride, act=act)
        self.branch2b = ConvNorm(c_out, c_out, 3, 1)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.branch2b(self.branch2a(x))
        return self.act(y + (self.short(x) if hasattr(self, "short") else x))


class BottleneckBlock(nn.Module):
    """1x1 -> 3x3 (strided) -> 1x1 (x4 channels) ConvNorms plus a shortcut (ResNet-50/101)."""

    expansion = 4

    def __init__(self, c_in: int, c_out: int, stride: int, project: bool, act: str = "relu"):
        super().__init__()
        self.branch2a = ConvNorm(c_in, c_out, 1, 1, act=act)
        self.branch2b = ConvNorm(c_out, c_out, 3, stride, act=act)
        self.branch2c = ConvNorm(c_out, c_out * self.expansion, 1, 1)
        if project:
            self.short = _shortcut(c_in, c_out * self.expansion, stride)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.branch2c(self.branch2b(self.branch2a(x)))
        return self.act(y + (self.short(x) if hasattr(self, "short") else x))


class ResStage(nn.Module):
    """``count`` residual blocks; the first one changes width/stride through a projection."""

    def __init__(self, block: type[nn.Module], c_in: int, c_out: int, count: int, stride: int,
                 act: str = "relu"):
        super().__init__()
        blocks = []
        for i in range(count):
            blocks.append(block(c_in, c_out, stride if i == 0 else 1, project=(i == 0), act=act))
            c_in = c_out * block.expansion
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


#: blocks per stage and block type for each depth
DEPTHS: dict[int, tuple[type[nn.Module], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (BottleneckBlock, (3, 4, 6, 3)),
    101: (BottleneckBlock, (3, 4, 23, 3)),
}


class PResNet(nn.Module):
    """ResNet-vd trunk returning the feature maps of the stages in ``return_idx``."""

    def __init__(self, depth: int, return_idx: tuple[int, ...] = (1, 2, 3), act: str = "relu"):
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"PResNet depth must be one of {sorted(DEPTHS)}, not {depth}")
        block, counts = DEPTHS[depth]
        self.conv1 = nn.Sequential(OrderedDict([
            ("conv1_1", ConvNorm(3, 32, 3, 2, act=act)),
            ("conv1_2", ConvNorm(32, 32, 3, 1, act=act)),
            ("conv1_3", ConvNorm(32, 64, 3, 1, act=act)),
        ]))
        c_in, stages = 64, []
        for i, (width, n) in enumerate(zip(STAGE_WIDTHS, counts)):
            stages.append(ResStage(block, c_in, width, n, 1 if i == 0 else 2, act))
            c_in = width * block.expansion
        self.res_layers = nn.ModuleList(stages)
        self.return_idx = tuple(return_idx)
        #: channels of each returned map
        self.out_channels = [STAGE_WIDTHS[i] * block.expansion for i in self.return_idx]
        self.out_strides = [4 * 2 ** i for i in self.return_idx]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = F.max_pool2d(self.conv1(x), kernel_size=3, stride=2, padding=1)
        outs = []
        for i, stage in enumerate(self.res_layers):
            x = stage(x)
            if i in self.return_idx:
                outs.append(x)
        return outs
