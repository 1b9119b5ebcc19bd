"""YOLO-NAS network: QARepVGG backbone, PAN neck with a stride-4 skip, DFL heads (Deci, 2023).

Layout follows the LibreYOLO checkpoints (SuperGradients' module tree): ``backbone.stem`` /
``stage1..4`` / ``context_module``, ``neck.neck1..4`` and ``heads.head1..3``. Size s is pinned by
the architecture fixture; n (the pose release's backbone), m and l use the widths and depths of
the original configurations.

Blocks:

* ``QARepVGG``: 3x3 conv + BN, a biased 1x1 conv (scaled by ``alpha`` where it has one) and the
  identity where shapes allow, summed, then a post-BN and ReLU. Checkpoints also carry the
  re-parameterized ``rbr_reparam`` conv; the training-form branches compute the output, and
  :meth:`YoloNASNet.fuse` writes the one equivalent conv into ``rbr_reparam`` for inference.
* ``CSP``: two 1x1 halves, one through a chain of bottlenecks (each ``alpha * x + cv2(cv1(x))``),
  concatenated (every bottleneck's output too for the m/l stages that ``concat`` them), 1x1 out.
* Up stages (neck1, neck2) reduce the skips, upsample by a 2x2 transposed conv and concatenate a
  downsampled finer skip; down stages (neck3, neck4) downsample and concatenate the up stage's
  intermediate.

Every BatchNorm has eps 1e-3 and momentum 0.03 (SuperGradients' detection recipe).

``forward`` returns ``(decoded, raw)``; N = sum over strides 8/16/32 of (H/s)(W/s), stride 8
first, row-major:

* ``decoded = (boxes, scores)``: (B, N, 4) xyxy in input pixels (anchor centre (col + 0.5, row +
  0.5) minus / plus the left, top, right, bottom distances, each the expectation of a softmax
  over ``REG_MAX + 1`` bins, times the stride) and (B, N, nc) class probabilities (sigmoid);
* ``raw = (cls_logits, dist_logits, anchors, points, counts, strides)``: (B, N, nc) logits,
  (B, N, 4 * (REG_MAX + 1)) distribution logits (side-major), (N, 4) grid-cell anchor boxes of
  side 5 strides in pixels, (N, 2) anchor centres in pixels, the per-level anchor counts (Python
  ints) and (N, 1) strides - the training loss's input.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.blocks import BN_EPS, BN_MOMENTUM, ConvBN, fold_bn

STRIDES = (8, 16, 32)
REG_MAX = 16
#: side of the grid-cell anchor boxes the static assigner would use, in strides
CELL_SIZE = 5.0
PRIOR_PROB = 0.01


@dataclass(frozen=True)
class YoloNASConfig:
    stem: int                                   # stem width
    stage_out: tuple[int, int, int, int]        # backbone stage widths (strides 4, 8, 16, 32)
    stage_blocks: tuple[int, int, int, int]     # bottlenecks per stage
    stage_hidden: tuple[int, int, int, int]     # bottleneck width per stage
    stage_concat: tuple[bool, bool, bool, bool]  # stage CSPs that concatenate every bottleneck's output
    neck_out: tuple[int, int, int, int]         # neck1 (up), neck2 (up), neck3 (down), neck4 (down)
    up_blocks: tuple[int, int]
    up_hidden: tuple[int, int]
    down_blocks: tuple[int, int]
    down_hidden: tuple[int, int]
    head_width: float                           # head width multiplier


CONFIGS: dict[str, YoloNASConfig] = {
    # n: the backbone and neck of YOLO-NAS-Pose N (no detection release at this size)
    "n": YoloNASConfig(32, (64, 128, 256, 512), (2, 3, 4, 2), (32, 48, 64, 128), (False,) * 4,
                       (128, 64, 128, 256), (2, 2), (48, 32), (2, 2), (48, 48), 0.33),
    "s": YoloNASConfig(48, (96, 192, 384, 768), (2, 3, 5, 2), (32, 64, 96, 192), (False,) * 4,
                       (192, 96, 192, 384), (2, 2), (64, 48), (2, 2), (64, 64), 0.5),
    "m": YoloNASConfig(48, (96, 192, 384, 768), (2, 3, 5, 2), (64, 128, 256, 384), (True, True, True, False),
                       (192, 96, 192, 384), (2, 3), (192, 64), (2, 3), (192, 256), 0.75),
    "l": YoloNASConfig(48, (96, 192, 384, 768), (2, 3, 5, 2), (96, 128, 256, 512), (True,) * 4,
                       (192, 96, 192, 384), (4, 4), (128, 128), (4, 4), (128, 256), 1.0),
}
#: detection head widths per level before the size's multiplier
HEAD_WIDTHS = (128, 256, 512)


def round_width(c: int, mult: float, divisor: int = 8) -> int:
    """``int(c * mult)`` rounded up to a multiple of ``divisor`` (SuperGradients' width rule)."""
    return math.ceil(int(c * mult) / divisor) * divisor


def batch_norm(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class ConvBR(ConvBN):
    """Conv (no bias) -> BatchNorm -> ReLU (``conv`` / ``bn`` in the layout)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1):
        super().__init__(c_in, c_out, k, s)
        self.act = nn.ReLU(inplace=True)


class SeqConvBR(nn.Module):
    """Conv (no bias) -> BatchNorm -> ReLU kept in one ``seq`` (the heads' layout)."""

    def __init__(self, c_in: int, c_out: int, k: int = 1):
        super().__init__()
        self.seq = nn.Sequential()
        self.seq.add_module("conv", nn.Conv2d(c_in, c_out, k, 1, k // 2, bias=False))
        self.seq.add_module("bn", batch_norm(c_out))
        self.seq.add_module("act", nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x)

    @torch.no_grad()
    def fuse(self) -> None:
        conv, bn = self.seq.conv, self.seq.bn
        if isinstance(bn, nn.Identity):
            return
        w, b = fold_bn(conv.weight, None, bn)
        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                          bias=True).to(device=w.device, dtype=w.dtype)
        fused.weight.copy_(w)
        fused.bias.copy_(b)
        fused.requires_grad_(False)
        self.seq.conv = fused
        self.seq.bn = nn.Identity()


class QARepVGG(nn.Module):
    """Quantization-aware RepVGG block (see the module docstring)."""

    def __init__(self, c_in: int, c_out: int, s: int = 1, identity: bool = True):
        super().__init__()
        self.branch_3x3 = nn.Sequential()
        self.branch_3x3.add_module("conv", nn.Conv2d(c_in, c_out, 3, s, 1, bias=False))
        self.branch_3x3.add_module("bn", batch_norm(c_out))
        self.branch_1x1 = nn.Conv2d(c_in, c_out, 1, s, 0, bias=True)
        self.identity = identity and c_in == c_out and s == 1
        self.post_bn = batch_norm(c_out)
        # the re-parameterized conv: unused until fuse() fills it (checkpoints carry it)
        self.rbr_reparam = nn.Conv2d(c_in, c_out, 3, s, 1, bias=True)
        self.act = nn.ReLU(inplace=True)
        self.fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self.act(self.rbr_reparam(x))
        y = self.branch_3x3(x) + self.branch_1x1(x)
        if self.identity:
            y = y + x
        return self.act(self.post_bn(y))

    @torch.no_grad()
    def fuse(self) -> None:
        """The branches and both BatchNorms as one 3x3 conv in ``rbr_reparam`` (inference only)."""
        if self.fused:
            return
        w, b = fold_bn(self.branch_3x3.conv.weight, None, self.branch_3x3.bn)
        w = w + F.pad(self.branch_1x1.weight, (1, 1, 1, 1))
        b = b + self.branch_1x1.bias
        if self.identity:
            c = w.shape[0]
            idx = torch.arange(c, device=w.device)
            w[idx, idx, 1, 1] += 1.0
        w, b = fold_bn(w, b, self.post_bn)
        self.rbr_reparam.weight.copy_(w)
        self.rbr_reparam.bias.copy_(b)
        self.rbr_reparam.requires_grad_(False)
        self.fused = True


class Bottleneck(nn.Module):
    """``alpha * x + cv2(cv1(x))`` with QARepVGG blocks (backbone, up stages) or 3x3 ConvBR (down
    stages); ``alpha`` is learned."""

    def __init__(self, c: int, rep: bool):
        super().__init__()
        self.cv1 = QARepVGG(c, c) if rep else ConvBR(c, c, 3)
        self.cv2 = QARepVGG(c, c) if rep else ConvBR(c, c, 3)
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x + self.cv2(self.cv1(x))


class CSP(nn.Module):
    """YOLO-NAS CSP layer (see the module docstring)."""

    def __init__(self, c_in: int, c_out: int, n: int, hidden: int, rep: bool = True, concat: bool = False):
        super().__init__()
        self.concat = concat
        self.conv1 = ConvBR(c_in, hidden)
        self.conv2 = ConvBR(c_in, hidden)
        self.conv3 = ConvBR(hidden * (2 + n * int(concat)), c_out)
        self.bottlenecks = nn.Sequential(*[Bottleneck(hidden, rep) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        parts = [y]
        for block in self.bottlenecks:
            y = block(y)
            parts.append(y)
        if not self.concat:
            parts = [y]
        return self.conv3(torch.cat((*parts, self.conv2(x)), 1))


class Stem(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = QARepVGG(c_in, c_out, 2, identity=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Stage(nn.Module):
    """A stride-2 QARepVGG then a CSP layer."""

    def __init__(self, c_in: int, c_out: int, n: int, hidden: int, concat: bool):
        super().__init__()
        self.downsample = QARepVGG(c_in, c_out, 2, identity=False)
        self.blocks = CSP(c_out, c_out, n, hidden, concat=concat)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class SPP(nn.Module):
    """1x1 halving, max pools of 5, 9 and 13 concatenated with their input, 1x1 out."""

    def __init__(self, c_in: int, c_out: int, ks: tuple[int, ...] = (5, 9, 13)):
        super().__init__()
        self.ks = ks
        self.cv1 = ConvBR(c_in, c_in // 2)
        self.cv2 = ConvBR(c_in // 2 * (len(ks) + 1), c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [F.max_pool2d(x, k, 1, k // 2) for k in self.ks], 1))


class Backbone(nn.Module):
    def __init__(self, cfg: YoloNASConfig):
        super().__init__()
        self.stem = Stem(3, cfg.stem)
        c = (cfg.stem, *cfg.stage_out)
        for i in range(4):
            self.add_module(f"stage{i + 1}", Stage(c[i], c[i + 1], cfg.stage_blocks[i], cfg.stage_hidden[i],
                                                   cfg.stage_concat[i]))
        self.context_module = SPP(c[4], c[4])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c2 = self.stage1(self.stem(x))
        c3 = self.stage2(c2)
        c4 = self.stage3(c3)
        return c2, c3, c4, self.context_module(self.stage4(c4))


class UpStage(nn.Module):
    """Reduce both skips to ``c_out``, upsample the coarse input by a 2x2 transposed conv,
    concatenate with the skip and the downsampled finer skip, reduce, CSP. Returns the reduced
    coarse input (the down stage's skip) and the output."""

    def __init__(self, c_in: int, skip1: int, skip2: int, c_out: int, n: int, hidden: int):
        super().__init__()
        self.reduce_skip1 = ConvBR(skip1, c_out)
        self.reduce_skip2 = ConvBR(skip2, c_out)
        self.conv = ConvBR(c_in, c_out)
        self.upsample = nn.ConvTranspose2d(c_out, c_out, 2, 2)
        self.downsample = ConvBR(c_out, c_out, 3, 2)
        self.reduce_after_concat = ConvBR(3 * c_out, c_out)
        self.blocks = CSP(c_out, c_out, n, hidden)

    def forward(self, x: torch.Tensor, skip1: torch.Tensor, skip2: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        inter = self.conv(x)
        y = torch.cat((self.upsample(inter), self.reduce_skip1(skip1),
                       self.downsample(self.reduce_skip2(skip2))), 1)
        return inter, self.blocks(self.reduce_after_concat(y))


class DownStage(nn.Module):
    """Stride-2 3x3 conv to half the output width, concatenated with the skip, CSP (ConvBR
    bottlenecks)."""

    def __init__(self, c_in: int, skip: int, c_out: int, n: int, hidden: int):
        super().__init__()
        self.conv = ConvBR(c_in, c_out // 2, 3, 2)
        self.blocks = CSP(c_out // 2 + skip, c_out, n, hidden, rep=False)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.blocks(torch.cat((self.conv(x), skip), 1))


class Neck(nn.Module):
    """PAN with the stride-4 skip: outputs at strides 8, 16, 32."""

    def __init__(self, cfg: YoloNASConfig):
        super().__init__()
        c2, c3, c4, c5 = cfg.stage_out
        n1, n2, n3, n4 = cfg.neck_out
        self.neck1 = UpStage(c5, c4, c3, n1, cfg.up_blocks[0], cfg.up_hidden[0])
        self.neck2 = UpStage(n1, c3, c2, n2, cfg.up_blocks[1], cfg.up_hidden[1])
        self.neck3 = DownStage(n2, n2, n3, cfg.down_blocks[0], cfg.down_hidden[0])
        self.neck4 = DownStage(n3, n1, n4, cfg.down_blocks[1], cfg.down_hidden[1])
        self.out_channels = (n2, n3, n4)

    def forward(self, feats: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c2, c3, c4, c5 = feats
        inter1, x = self.neck1(c5, c4, c3)
        inter2, p3 = self.neck2(x, c3, c2)
        p4 = self.neck3(p3, inter2)
        return p3, p4, self.neck4(p4, inter1)


class DFLHead(nn.Module):
    """One level's head: a 1x1 stem, one 3x3 conv per branch, class and distribution 1x1 convs."""

    def __init__(self, c_in: int, width: int, nc: int):
        super().__init__()
        self.stem = SeqConvBR(c_in, width)
        self.cls_convs = nn.Sequential(SeqConvBR(width, width, 3))
        self.reg_convs = nn.Sequential(SeqConvBR(width, width, 3))
        self.cls_pred = nn.Conv2d(width, nc, 1)
        self.reg_pred = nn.Conv2d(width, 4 * (REG_MAX + 1), 1)
        nn.init.constant_(self.cls_pred.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.stem(x)
        return self.cls_pred(self.cls_convs(x)), self.reg_pred(self.reg_convs(x))


def anchor_grid(hw: list, strides: tuple[int, ...], dtype: torch.dtype, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Anchor centres (N, 2) in grid units ((col + 0.5, row + 0.5)), their strides (N, 1) and the
    grid-cell anchor boxes (N, 4) xyxy in pixels (side ``CELL_SIZE`` strides), level after level."""
    points, strides_out = [], []
    for (h, w), s in zip(hw, strides):
        ys = torch.arange(h, dtype=dtype, device=device) + 0.5
        xs = torch.arange(w, dtype=dtype, device=device) + 0.5
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((gx.reshape(-1), gy.reshape(-1)), -1))
        strides_out.append(torch.full((h * w, 1), float(s), dtype=dtype, device=device))
    pts, st = torch.cat(points), torch.cat(strides_out)
    half = st * (CELL_SIZE / 2)
    px = pts * st
    return pts, st, torch.cat((px - half, px + half), -1)


def dfl_expectation(dist_logits: torch.Tensor) -> torch.Tensor:
    """(..., 4 * (REG_MAX + 1)) side-major logits -> (..., 4) expectations over bins 0..REG_MAX."""
    bins = torch.arange(REG_MAX + 1, dtype=dist_logits.dtype, device=dist_logits.device)
    shape = dist_logits.shape[:-1]
    return (dist_logits.reshape(*shape, 4, REG_MAX + 1).softmax(-1) * bins).sum(-1)


class DFLHeads(nn.Module):
    """The three levels' heads and the decoding (see the module docstring for the outputs)."""

    def __init__(self, chans: tuple[int, int, int], nc: int, width_mult: float):
        super().__init__()
        self.nc = nc
        for i, (c, w) in enumerate(zip(chans, HEAD_WIDTHS)):
            self.add_module(f"head{i + 1}", DFLHead(c, round_width(w, width_mult), nc))

    def forward(self, feats: tuple[torch.Tensor, ...]):
        cls_maps, reg_maps = zip(*(getattr(self, f"head{i + 1}")(f) for i, f in enumerate(feats)))
        cls_logits = torch.cat([m.flatten(2) for m in cls_maps], 2).transpose(1, 2)     # (B, N, nc)
        dist_logits = torch.cat([m.flatten(2) for m in reg_maps], 2).transpose(1, 2)    # (B, N, 68)
        hw = [tuple(m.shape[-2:]) for m in cls_maps]   # not int(): a traced export keeps them dynamic
        points, strides, anchors = anchor_grid(hw, STRIDES, cls_logits.dtype, cls_logits.device)
        d = dfl_expectation(dist_logits)
        boxes = torch.cat((points - d[..., :2], points + d[..., 2:]), -1) * strides
        counts = tuple(int(h * w) for h, w in hw)
        decoded = (boxes, cls_logits.sigmoid())
        return decoded, (cls_logits, dist_logits, anchors, points * strides, counts, strides)


class YoloNASNet(nn.Module):
    """The whole detector (see the module docstring)."""

    def __init__(self, size: str = "s", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown YOLO-NAS size {size!r}; sizes: {', '.join(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        self.backbone = Backbone(cfg)
        self.neck = Neck(cfg)
        self.heads = self.build_heads(cfg, nc)

    def build_heads(self, cfg: YoloNASConfig, nc: int) -> nn.Module:
        return DFLHeads(self.neck.out_channels, nc, cfg.head_width)

    def forward(self, x: torch.Tensor):
        return self.heads(self.neck(self.backbone(x)))

    def fuse(self) -> YoloNASNet:
        """Re-parameterize every QARepVGG block and fold every BatchNorm (inference only)."""
        for m in list(self.modules()):
            if isinstance(m, (QARepVGG, ConvBN, SeqConvBR)):
                m.fuse()
        return self
