"""PicoSAM3 network: a 1.37 M-parameter depthwise-separable U-Net that segments one ROI crop.

Layout (the LibreYOLO / upstream PicoSAM3 checkpoints' names): four encoder stages, each a
depthwise-separable block (3x3 depthwise conv-BN-ReLU, 1x1 conv-BN-ReLU) at widths 48, 96, 160,
256, with a strided 3x3 conv (``down1``-``down4``) after each; a ``bottleneck`` (a separable block
to 320, then a 3x3 depthwise conv of dilation 2 and a 1x1 conv, each with BN-ReLU); four decoder
steps ``up1``-``up4`` (nearest 2x upsampling, then a separable block: 192, 128, 80, 40) each added
to a 1x1 projection of the encoder stage of its resolution (``skip_conn4``-``skip_conn1``); a
channel-attention gate ``eca`` (global average, 1x1 conv, sigmoid); and ``refine`` (3x3 depthwise
conv-BN-ReLU, 1x1 conv to one logit map). Input: a (B, 3, 96, 96) ImageNet-normalized crop;
output: (B, 1, 96, 96) mask logits of that crop. Fully convolutional, no host synchronisation.
"""
from __future__ import annotations

import torch
from torch import nn

#: the crop size the network was trained at (the only one used)
ROI_SIZE = 96
ENCODER_WIDTHS = (48, 96, 160, 256)
BOTTLENECK_WIDTH = 320
DECODER_WIDTHS = (192, 128, 80, 40)


def separable(cin: int, cout: int) -> nn.Sequential:
    """3x3 depthwise conv-BN-ReLU, then 1x1 conv-BN-ReLU (indices 0-5 as the checkpoints name them)."""
    return nn.Sequential(nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                         nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class ChannelGate(nn.Module):
    """``x * sigmoid(conv1x1(mean over H, W of x))``: PicoSAM3's "ECA" block."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1x1 = nn.Conv2d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv1x1(x.mean((2, 3), keepdim=True)))


class PicoSAM3Net(nn.Module):
    """Normalized (B, 3, 96, 96) ROI crops -> (B, 1, 96, 96) mask logits."""

    def __init__(self):
        super().__init__()
        e1, e2, e3, e4 = ENCODER_WIDTHS
        d1, d2, d3, d4 = DECODER_WIDTHS
        b = BOTTLENECK_WIDTH
        self.encoder_stage1 = separable(3, e1)
        self.down1 = nn.Conv2d(e1, e1, 3, 2, 1, bias=False)
        self.encoder_stage2 = separable(e1, e2)
        self.down2 = nn.Conv2d(e2, e2, 3, 2, 1, bias=False)
        self.encoder_stage3 = separable(e2, e3)
        self.down3 = nn.Conv2d(e3, e3, 3, 2, 1, bias=False)
        self.encoder_stage4 = separable(e3, e4)
        self.down4 = nn.Conv2d(e4, e4, 3, 2, 1, bias=False)
        self.bottleneck = nn.Sequential(
            separable(e4, b),
            nn.Conv2d(b, b, 3, padding=2, dilation=2, groups=b, bias=False), nn.BatchNorm2d(b), nn.ReLU(),
            nn.Conv2d(b, b, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU())
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), separable(b, d1))
        self.skip_conn4 = nn.Conv2d(e4, d1, 1)
        self.up2 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), separable(d1, d2))
        self.skip_conn3 = nn.Conv2d(e3, d2, 1)
        self.up3 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), separable(d2, d3))
        self.skip_conn2 = nn.Conv2d(e2, d3, 1)
        self.up4 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), separable(d3, d4))
        self.skip_conn1 = nn.Conv2d(e1, d4, 1)
        self.eca = ChannelGate(d4)
        self.refine = nn.Sequential(nn.Conv2d(d4, d4, 3, padding=1, groups=d4, bias=False), nn.BatchNorm2d(d4),
                                    nn.ReLU(), nn.Conv2d(d4, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f1 = self.encoder_stage1(x)
        f2 = self.encoder_stage2(self.down1(f1))
        f3 = self.encoder_stage3(self.down2(f2))
        f4 = self.encoder_stage4(self.down3(f3))
        y = self.bottleneck(self.down4(f4))
        y = self.up1(y) + self.skip_conn4(f4)
        y = self.up2(y) + self.skip_conn3(f3)
        y = self.up3(y) + self.skip_conn2(f2)
        y = self.up4(y) + self.skip_conn1(f1)
        return self.refine(self.eca(y))
