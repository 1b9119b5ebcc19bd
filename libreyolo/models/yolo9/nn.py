"""YOLOv9 (GELAN) network in the LibreYOLO checkpoint layout.

Layout: ``backbone.*`` (stem, ELAN / RepNCSPELAN stages, SPPELAN), ``neck.*`` (PAN:
two top-down and two bottom-up GELAN blocks) and ``head.cv2`` / ``head.cv3`` (per-level
box and class towers). Sizes t and s are pinned by the architecture fixtures; m and c
follow the widths and depths of the original GELAN-M / GELAN-C configurations.

In eval mode ``forward`` returns ``{"predictions": (B, 4+nc, N), "raw_outputs": [3 maps],
"x8"/"x16"/"x32": {"features": ...}}``; predictions are xyxy boxes in input pixels then
per-class sigmoid scores. In train mode it returns the list of raw head maps.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.assign import cached, prior_grid
from ..common.blocks import ELAN, SPPELAN, AConv, ADown, ConvBN, RepNCSPELAN, fuse_modules

STRIDES = (8, 16, 32)
REG_MAX = 16


@dataclass(frozen=True)
class Yolo9Config:
    stem: tuple[int, int]            # conv0, conv1 output channels
    first: str                       # "elan" or "gelan"
    first_out: int
    first_part: int
    down: str                        # "aconv" or "adown"
    stages: tuple[tuple[int, int, int], ...]  # (down_out, elan_out, elan_part) for P3, P4, P5
    spp_out: int
    depth: int                       # RepCSP bottlenecks per GELAN branch
    up1: int                         # top-down P4 width (out == part)
    up2: int                         # top-down P3 width
    down1: int                       # bottom-up downsample width after P3
    down_p4: int                     # bottom-up P4 width
    down2: int                       # bottom-up downsample width after P4
    down_p5: int                     # bottom-up P5 width


CONFIGS: dict[str, Yolo9Config] = {
    "t": Yolo9Config((16, 32), "elan", 32, 32, "aconv",
                     ((64, 64, 64), (96, 96, 96), (128, 128, 128)), 128, 3,
                     96, 64, 48, 96, 64, 128),
    "s": Yolo9Config((32, 64), "elan", 64, 64, "aconv",
                     ((128, 128, 128), (192, 192, 192), (256, 256, 256)), 256, 3,
                     192, 128, 96, 192, 128, 256),
    "m": Yolo9Config((32, 64), "gelan", 128, 128, "aconv",
                     ((240, 240, 240), (360, 360, 360), (480, 480, 480)), 480, 1,
                     360, 240, 184, 360, 240, 480),
    "c": Yolo9Config((64, 128), "gelan", 256, 128, "adown",
                     ((256, 512, 256), (512, 512, 512), (512, 512, 512)), 512, 1,
                     512, 256, 256, 512, 512, 512),
}


def down_block(kind: str, c_in: int, c_out: int) -> nn.Module:
    return ADown(c_in, c_out) if kind == "adown" else AConv(c_in, c_out)


def gelan_block(c_in: int, width: int, c_out: int, n: int) -> RepNCSPELAN:
    return RepNCSPELAN(c_in, width, width // 2, c_out, n)


class Backbone(nn.Module):
    def __init__(self, cfg: Yolo9Config):
        super().__init__()
        c0, c1 = cfg.stem
        self.conv0 = ConvBN(3, c0, 3, 2)
        self.conv1 = ConvBN(c0, c1, 3, 2)
        if cfg.first == "elan":
            self.elan1 = ELAN(c1, cfg.first_part, cfg.first_part // 2, cfg.first_out)
        else:
            self.elan1 = gelan_block(c1, cfg.first_part, cfg.first_out, cfg.depth)
        prev = cfg.first_out
        for i, (d_out, e_out, part) in enumerate(cfg.stages, start=2):
            setattr(self, f"down{i}", down_block(cfg.down, prev, d_out))
            setattr(self, f"elan{i}", gelan_block(d_out, part, e_out, cfg.depth))
            prev = e_out
        self.spp = SPPELAN(prev, cfg.spp_out // 2, cfg.spp_out)

    def forward(self, x: torch.Tensor):
        return self.levels(x)[1:]

    def levels(self, x: torch.Tensor):
        """The stride 4, 8, 16 and 32 outputs (the stride-4 one feeds the P2 variant's neck)."""
        p2 = self.elan1(self.conv1(self.conv0(x)))
        p3 = self.elan2(self.down2(p2))
        p4 = self.elan3(self.down3(p3))
        p5 = self.spp(self.elan4(self.down4(p4)))
        return p2, p3, p4, p5


class Neck(nn.Module):
    def __init__(self, cfg: Yolo9Config):
        super().__init__()
        b3, b4, n = cfg.stages[0][1], cfg.stages[1][1], cfg.depth
        self.elan_up1 = gelan_block(cfg.spp_out + b4, cfg.up1, cfg.up1, n)
        self.elan_up2 = gelan_block(cfg.up1 + b3, cfg.up2, cfg.up2, n)
        self.down1 = down_block(cfg.down, cfg.up2, cfg.down1)
        self.elan_down1 = gelan_block(cfg.down1 + cfg.up1, cfg.down_p4, cfg.down_p4, n)
        self.down2 = down_block(cfg.down, cfg.down_p4, cfg.down2)
        self.elan_down2 = gelan_block(cfg.down2 + cfg.spp_out, cfg.down_p5, cfg.down_p5, n)

    def forward(self, p3, p4, p5):
        n4 = self.elan_up1(torch.cat((F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4), 1))
        o3 = self.elan_up2(torch.cat((F.interpolate(n4, scale_factor=2.0, mode="nearest"), p3), 1))
        o4 = self.elan_down1(torch.cat((self.down1(o3), n4), 1))
        o5 = self.elan_down2(torch.cat((self.down2(o4), p5), 1))
        return o3, o4, o5


def box_towers(channels: tuple[int, ...], hidden: int, reg_max: int) -> nn.ModuleList:
    """Per-level box towers: 3x3 ConvBN, grouped 3x3 ConvBN, grouped 1x1 conv to 4 x reg_max logits."""
    return nn.ModuleList(
        nn.Sequential(ConvBN(c, hidden, 3), ConvBN(hidden, hidden, 3, g=4), nn.Conv2d(hidden, 4 * reg_max, 1, groups=4))
        for c in channels)


def class_towers(channels: tuple[int, ...], hidden: int, nc: int) -> nn.ModuleList:
    """Per-level class towers: two 3x3 ConvBN, then a 1x1 conv to ``nc`` logits."""
    return nn.ModuleList(
        nn.Sequential(ConvBN(c, hidden, 3), ConvBN(hidden, hidden, 3), nn.Conv2d(hidden, nc, 1))
        for c in channels)


class DetectHead(nn.Module):
    """Decoupled anchor-free head: grouped box towers (DFL logits) and class towers."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = REG_MAX,
                 strides: tuple[int, ...] = STRIDES):
        super().__init__()
        self.nc, self.reg_max, self.strides = nc, reg_max, tuple(strides)
        box_hidden = max(-(-(channels[0] // 4) // 4) * 4, 4 * reg_max, reg_max)
        cls_hidden = max(channels[0], min(nc, 100))
        self.cv2 = box_towers(channels, box_hidden, reg_max)
        self.cv3 = class_towers(channels, cls_hidden, nc)
        self.register_buffer("dfl_bins", torch.arange(reg_max, dtype=torch.float32), persistent=False)
        self._grid_cache: dict = {}
        self.reset_bias()

    def reset_bias(self) -> None:
        """Training-from-scratch prior: box logits start flat, class scores near zero."""
        for box, cls in zip(self.cv2, self.cv3):
            nn.init.constant_(box[-1].bias, 1.0)
            nn.init.constant_(cls[-1].bias, -10.0)

    def forward(self, feats):
        return [torch.cat((b(f), c(f)), 1) for f, b, c in zip(feats, self.cv2, self.cv3)]

    def anchors(self, maps, dtype, device):
        """Anchor centres (2, N) in grid units and per-anchor stride (1, N), cached per shape
        (not under torch.compile: :func:`cached`)."""
        hws = tuple(tuple(m.shape[-2:]) for m in maps)
        return cached(self._grid_cache, (hws, dtype, device),   # prior_grid's (N, 2) / (N, 1), transposed
                      lambda: tuple(t.T.contiguous() for t in prior_grid(hws, self.strides, 0.5, False, dtype, device)))

    def decode(self, maps):
        """Raw maps -> (B, 4+nc, N): xyxy in input pixels, then class probabilities."""
        b = maps[0].shape[0]
        flat = torch.cat([m.flatten(2) for m in maps], 2)
        box_logits, cls_logits = flat.split((4 * self.reg_max, self.nc), 1)
        n = flat.shape[-1]
        prob = box_logits.reshape(b, 4, self.reg_max, n).softmax(2)
        dist = (prob * self.dfl_bins.to(prob.dtype).reshape(1, 1, -1, 1)).sum(2)
        points, strides = self.anchors(maps, dist.dtype, dist.device)
        lt, rb = dist.chunk(2, 1)
        boxes = torch.cat((points - lt, points + rb), 1) * strides
        return torch.cat((boxes, cls_logits.sigmoid()), 1)


class Yolo9Net(nn.Module):
    """The whole YOLOv9 network for one size."""

    def __init__(self, size: str = "t", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown yolo9 size {size!r}; choose one of {sorted(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        self.backbone = Backbone(cfg)
        self.neck = Neck(cfg)
        self.head = DetectHead(nc, (cfg.up2, cfg.down_p4, cfg.down_p5))
        self.stride = STRIDES

    def forward(self, x: torch.Tensor):
        n3, n4, n5 = self.neck(*self.backbone(x))
        maps = self.head((n3, n4, n5))
        if self.training:
            return maps
        return {"predictions": self.head.decode(maps), "raw_outputs": maps,
                "x8": {"features": n3}, "x16": {"features": n4}, "x32": {"features": n5}}

    def fuse(self) -> Yolo9Net:
        return fuse_modules(self)
