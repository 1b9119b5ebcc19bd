"""YOLO-NAS-R network: the YOLO-NAS backbone and neck with rotated-box DFL heads.

Each level's head (``heads.headK``) is the detector's (a 1x1 stem, one 3x3 conv for classes and
one for regression) with four 1x1 predictions: ``cls_pred`` (nc logits), ``reg_pred`` (width and
height distributions, 2 x 17 bins), ``rot_pred`` (one rotation logit) and ``offset_pred`` (the
centre's offset from the anchor point, in strides); the last three read the regression branch.

``forward`` returns ``(decoded, raw)``, N anchors as in :mod:`.nn`:

* ``decoded = (rboxes (B, N, 5), scores (B, N, nc))``: centre ``(offset + (col + 0.5, row + 0.5))
  * stride``, width and height the DFL expectations times the stride, the angle
  ``(sigmoid(rot) - 0.25) * pi`` radians (range [-pi/4, 3pi/4)), class probabilities (sigmoid);
* ``raw``: a dict of ``score_logits`` (B, N, nc), ``size_dist`` (B, N, 34) raw DFL logits (width then
  height), ``size_reduced`` (B, N, 2) expectations in strides, ``angles`` (B, N, 1), ``offsets``
  (B, N, 2), ``anchor_points`` (N, 2) in grid units, ``strides`` (N, 1) and ``reg_max``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .nn import (
    HEAD_WIDTHS,
    PRIOR_PROB,
    REG_MAX,
    STRIDES,
    SeqConvBR,
    YoloNASConfig,
    YoloNASNet,
    anchor_grid,
    round_width,
)


class RotatedDFLHead(nn.Module):
    """One level's rotated-box head (see the module docstring)."""

    def __init__(self, c_in: int, width: int, nc: int):
        super().__init__()
        self.stem = SeqConvBR(c_in, width)
        self.cls_convs = nn.Sequential(SeqConvBR(width, width, 3))
        self.reg_convs = nn.Sequential(SeqConvBR(width, width, 3))
        self.cls_pred = nn.Conv2d(width, nc, 1)
        self.reg_pred = nn.Conv2d(width, 2 * (REG_MAX + 1), 1)
        self.rot_pred = nn.Conv2d(width, 1, 1)
        self.offset_pred = nn.Conv2d(width, 2, 1)
        nn.init.constant_(self.cls_pred.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.stem(x)
        reg = self.reg_convs(x)
        return self.cls_pred(self.cls_convs(x)), self.reg_pred(reg), self.rot_pred(reg), self.offset_pred(reg)


def size_expectation(dist_logits: torch.Tensor) -> torch.Tensor:
    """(..., 2 * (REG_MAX + 1)) width-then-height logits -> (..., 2) expectations over bins 0..REG_MAX."""
    bins = torch.arange(REG_MAX + 1, dtype=dist_logits.dtype, device=dist_logits.device)
    shape = dist_logits.shape[:-1]
    return (dist_logits.reshape(*shape, 2, REG_MAX + 1).softmax(-1) * bins).sum(-1)


class RotatedDFLHeads(nn.Module):
    """The three levels' rotated heads and the decoding (see the module docstring)."""

    def __init__(self, chans: tuple[int, int, int], nc: int, width_mult: float):
        super().__init__()
        self.nc = nc
        for i, (c, w) in enumerate(zip(chans, HEAD_WIDTHS)):
            self.add_module(f"head{i + 1}", RotatedDFLHead(c, round_width(w, width_mult), nc))

    def forward(self, feats: tuple[torch.Tensor, ...]):
        outs = [getattr(self, f"head{i + 1}")(f) for i, f in enumerate(feats)]

        def cat(j: int) -> torch.Tensor:
            return torch.cat([o[j].flatten(2) for o in outs], 2).transpose(1, 2)

        cls_logits, size_dist, rot, offsets = cat(0), cat(1), cat(2), cat(3)
        hw = [tuple(o[0].shape[-2:]) for o in outs]   # not int(): a traced export keeps them dynamic
        points, strides, _ = anchor_grid(hw, STRIDES, cls_logits.dtype, cls_logits.device)
        size = size_expectation(size_dist)
        angles = (rot.sigmoid() - 0.25) * math.pi
        rboxes = torch.cat(((offsets + points) * strides, size * strides, angles), -1)
        raw = {"score_logits": cls_logits, "size_dist": size_dist, "size_reduced": size, "angles": angles,
               "offsets": offsets, "anchor_points": points, "strides": strides, "reg_max": REG_MAX}
        return (rboxes, cls_logits.sigmoid()), raw


class YoloNASOBBNet(YoloNASNet):
    """The whole rotated-box network (see the module docstring)."""

    def build_heads(self, cfg: YoloNASConfig, nc: int) -> nn.Module:
        return RotatedDFLHeads(self.neck.out_channels, nc, cfg.head_width)


__all__ = ["RotatedDFLHeads", "YoloNASOBBNet"]
