"""YOLOv9-P2: YOLOv9 (GELAN) with an extra stride-4 detection level, for small objects.

Same backbone as YOLOv9. The neck keeps YOLOv9's four PAN blocks (their names and order come
first in the checkpoint) and adds a third top-down block to stride 4 (``elan_up3``, fed with the
backbone's stride-4 ``elan1`` output) and a bottom-up block back to stride 8 (``down0``,
``elan_down0``), which then feeds YOLOv9's bottom-up path. The head has four levels (strides 4,
8, 16, 32, finest first). Sizes t and s, with YOLOv9's widths; the stride-4 block is as wide as
the backbone's stride-4 stage.

Eval output: ``{"predictions": (B, 4+nc, N), "raw_outputs": [4 maps], "x4"/"x8"/"x16"/"x32":
{"features": ...}}``; train mode returns the list of raw head maps.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.blocks import fuse_modules
from ..yolo9.nn import CONFIGS as YOLO9_CONFIGS
from ..yolo9.nn import Backbone, DetectHead, Neck, Yolo9Config, down_block, gelan_block

STRIDES = (4, 8, 16, 32)
CONFIGS: dict[str, Yolo9Config] = {k: YOLO9_CONFIGS[k] for k in ("t", "s")}


class P2Neck(Neck):
    """YOLOv9's PAN plus the stride-4 top-down block and the bottom-up block back to stride 8."""

    def __init__(self, cfg: Yolo9Config):
        super().__init__(cfg)
        p2 = cfg.first_out
        self.elan_up3 = gelan_block(cfg.up2 + p2, p2, p2, cfg.depth)
        self.down0 = down_block(cfg.down, p2, p2)
        self.elan_down0 = gelan_block(p2 + cfg.up2, cfg.up2, cfg.up2, cfg.depth)

    def forward(self, p2, p3, p4, p5):
        n4 = self.elan_up1(torch.cat((F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4), 1))
        n3 = self.elan_up2(torch.cat((F.interpolate(n4, scale_factor=2.0, mode="nearest"), p3), 1))
        o2 = self.elan_up3(torch.cat((F.interpolate(n3, scale_factor=2.0, mode="nearest"), p2), 1))
        o3 = self.elan_down0(torch.cat((self.down0(o2), n3), 1))
        o4 = self.elan_down1(torch.cat((self.down1(o3), n4), 1))
        o5 = self.elan_down2(torch.cat((self.down2(o4), p5), 1))
        return o2, o3, o4, o5


class Yolo9P2Net(nn.Module):
    """The whole YOLOv9-P2 network for one size."""

    def __init__(self, size: str = "t", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown yolo9_p2 size {size!r}; choose one of {sorted(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        self.backbone = Backbone(cfg)
        self.neck = P2Neck(cfg)
        self.head = DetectHead(nc, (cfg.first_out, cfg.up2, cfg.down_p4, cfg.down_p5), strides=STRIDES)
        self.stride = STRIDES

    def forward(self, x: torch.Tensor):
        feats = self.neck(*self.backbone.levels(x))
        maps = self.head(feats)
        if self.training:
            return maps
        out = {"predictions": self.head.decode(maps), "raw_outputs": maps}
        out.update({f"x{s}": {"features": f} for s, f in zip(STRIDES, feats)})
        return out

    def fuse(self) -> Yolo9P2Net:
        return fuse_modules(self)
