"""YOLOv9-E2E: YOLOv9 (GELAN) with a second, one-to-one head and no NMS (YOLOv10's recipe).

Backbone and neck are YOLOv9's. The head holds YOLOv9's towers (``head.cv2`` / ``head.cv3``, the
one-to-many branch, trained with the usual top-10 task-aligned assignment) and a copy of them
(``head.one2one_cv2`` / ``head.one2one_cv3``) trained with a top-1 assignment, fed with detached
neck features as in YOLOv10, so that each object gets one confident anchor and no NMS is needed.
Sizes t, s, m, c with YOLOv9's widths.

Eval mode runs the one-to-one branch only: ``{"predictions": (B, 4+nc, N), "raw_outputs": [3
maps], "x8"/"x16"/"x32": {"features": ...}}``, the same format as YOLOv9's. Train mode returns
``{"one2many": [3 maps], "one2one": [3 maps]}``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..common.blocks import fuse_modules
from ..yolo9.nn import CONFIGS, REG_MAX, Backbone, DetectHead, Neck, box_towers, class_towers


class E2EHead(DetectHead):
    """YOLOv9's head (the one-to-many branch) plus a one-to-one copy of its towers."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int = REG_MAX):
        super().__init__(nc, channels, reg_max)
        box_hidden = self.cv2[0][0].conv.out_channels
        cls_hidden = self.cv3[0][0].conv.out_channels
        self.one2one_cv2 = box_towers(channels, box_hidden, reg_max)
        self.one2one_cv3 = class_towers(channels, cls_hidden, nc)
        self.reset_bias()

    def reset_bias(self) -> None:
        super().reset_bias()
        if hasattr(self, "one2one_cv2"):
            for box, cls in zip(self.one2one_cv2, self.one2one_cv3):
                nn.init.constant_(box[-1].bias, 1.0)
                nn.init.constant_(cls[-1].bias, -10.0)

    def one2one(self, feats):
        """The one-to-one branch's raw maps (B, 4*reg_max + nc, H, W) per level."""
        return [torch.cat((b(f), c(f)), 1) for f, b, c in zip(feats, self.one2one_cv2, self.one2one_cv3)]


class Yolo9E2ENet(nn.Module):
    """The whole YOLOv9-E2E network for one size."""

    def __init__(self, size: str = "t", nc: int = 80):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown yolo9_e2e size {size!r}; choose one of {sorted(CONFIGS)}")
        cfg = CONFIGS[size]
        self.size, self.nc = size, nc
        self.backbone = Backbone(cfg)
        self.neck = Neck(cfg)
        self.head = E2EHead(nc, (cfg.up2, cfg.down_p4, cfg.down_p5))
        self.stride = self.head.strides

    def forward(self, x: torch.Tensor):
        feats = self.neck(*self.backbone(x))
        if self.training:
            return {"one2many": self.head(feats), "one2one": self.head.one2one([f.detach() for f in feats])}
        maps = self.head.one2one(feats)
        n3, n4, n5 = feats
        return {"predictions": self.head.decode(maps), "raw_outputs": maps,
                "x8": {"features": n3}, "x16": {"features": n4}, "x32": {"features": n5}}

    def fuse(self) -> Yolo9E2ENet:
        return fuse_modules(self)
