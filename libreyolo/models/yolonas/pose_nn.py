"""YOLO-NAS-Pose network: the YOLO-NAS backbone and neck with pose DFL heads (Deci, 2023).

Each level's head (``heads.headK``) has separate 1x1 stems for the box and the keypoint
branches (``bbox_stem`` / ``pose_stem``), one 3x3 conv each for classes and box distributions,
2 (strides 8, 16) or 3 (stride 32) 3x3 convs for the keypoints, and three 1x1 predictions:
``cls_pred`` (1 + K channels: the person logit, then one visibility logit per keypoint),
``reg_pred`` (4 x 17 distribution bins) and ``pose_pred`` (K x 2 offsets). Widths: 128 / 256 /
512 (box) and 128 / 512 / 512 (keypoints) times the size's multiplier, rounded up to multiples
of 8.

``forward`` returns ``(decoded, raw)``, N anchors as in :mod:`.nn`:

* ``decoded = (boxes (B, N, 4) xyxy px, scores (B, N, nc), keypoints (B, N, K, 2) px, visibility
  (B, N, K) probabilities)``; a keypoint is ``(offset + (col, row)) * stride`` (the anchor centre
  minus the half-cell offset);
* ``raw = (cls_logits (B, N, nc), dist_logits (B, N, 68), keypoints (B, N, K, 2) px, visibility
  logits (B, N, K), anchors (N, 4), anchor centres (N, 2) px, per-level counts, strides (N, 1))``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .nn import (
    CONFIGS,
    PRIOR_PROB,
    REG_MAX,
    STRIDES,
    SeqConvBR,
    YoloNASConfig,
    YoloNASNet,
    anchor_grid,
    dfl_expectation,
    round_width,
)

#: box and keypoint branch widths per level before the size's multiplier, keypoint convs per level
POSE_BOX_WIDTHS = (128, 256, 512)
POSE_KPT_WIDTHS = (128, 512, 512)
POSE_KPT_CONVS = (2, 2, 3)
COCO_KEYPOINTS = 17
#: the pose sizes and their head multipliers (the backbone and neck are the detector's)
POSE_HEAD_WIDTH = {"n": 0.33, "s": 0.5, "m": 0.75, "l": 1.0}


class _ScaleGrad(torch.autograd.Function):
    """The identity whose backward multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class PoseDFLHead(nn.Module):
    """One level's pose head (see the module docstring).

    ``kpt_grad``: the keypoint branch's gradient into the shared features (the neck's) is
    multiplied by it while training (1: unchanged); the keypoint terms then still train the
    keypoint branch fully but pull less on the features the boxes and classes share. The forward
    is the same either way, and outside training (no gradient) nothing is added."""

    def __init__(self, c_in: int, box_width: int, kpt_width: int, kpt_convs: int, nc: int, num_keypoints: int):
        super().__init__()
        self.nc, self.num_keypoints = nc, num_keypoints
        self.kpt_grad = 1.0
        self.pose_stem = SeqConvBR(c_in, kpt_width)
        self.bbox_stem = SeqConvBR(c_in, box_width)
        self.cls_convs = nn.Sequential(SeqConvBR(box_width, box_width, 3))
        self.reg_convs = nn.Sequential(SeqConvBR(box_width, box_width, 3))
        self.pose_convs = nn.Sequential(*[SeqConvBR(kpt_width, kpt_width, 3) for _ in range(kpt_convs)])
        self.cls_pred = nn.Conv2d(box_width, nc + num_keypoints, 1)
        self.reg_pred = nn.Conv2d(box_width, 4 * (REG_MAX + 1), 1)
        self.pose_pred = nn.Conv2d(kpt_width, 2 * num_keypoints, 1)
        # the class logits at the detector's prior, the visibility logits at probability 0.5
        # (YoloNASPose.init_for_training says why)
        with torch.no_grad():
            self.cls_pred.bias[:nc] = -math.log((1 - PRIOR_PROB) / PRIOR_PROB)
            self.cls_pred.bias[nc:] = 0.0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        box = self.bbox_stem(x)
        cls = self.cls_pred(self.cls_convs(box))
        xk = _ScaleGrad.apply(x, self.kpt_grad) if self.kpt_grad != 1.0 and torch.is_grad_enabled() else x
        return (cls[:, :self.nc], self.reg_pred(self.reg_convs(box)),
                self.pose_pred(self.pose_convs(self.pose_stem(xk))), cls[:, self.nc:])


class PoseDFLHeads(nn.Module):
    """The three levels' pose heads and the decoding (see the module docstring)."""

    def __init__(self, chans: tuple[int, int, int], nc: int, num_keypoints: int, width_mult: float):
        super().__init__()
        self.nc, self.num_keypoints = nc, num_keypoints
        for i, c in enumerate(chans):
            self.add_module(f"head{i + 1}", PoseDFLHead(c, round_width(POSE_BOX_WIDTHS[i], width_mult),
                                                        round_width(POSE_KPT_WIDTHS[i], width_mult),
                                                        POSE_KPT_CONVS[i], nc, num_keypoints))

    def forward(self, feats: tuple[torch.Tensor, ...]):
        outs = [getattr(self, f"head{i + 1}")(f) for i, f in enumerate(feats)]
        b, k = feats[0].shape[0], self.num_keypoints
        cls_logits = torch.cat([o[0].flatten(2) for o in outs], 2).transpose(1, 2)       # (B, N, nc)
        dist_logits = torch.cat([o[1].flatten(2) for o in outs], 2).transpose(1, 2)      # (B, N, 68)
        offsets = torch.cat([o[2].reshape(b, k, 2, -1) for o in outs], 3).permute(0, 3, 1, 2)  # (B, N, K, 2)
        vis_logits = torch.cat([o[3].flatten(2) for o in outs], 2).transpose(1, 2)       # (B, N, K)
        hw = [tuple(o[0].shape[-2:]) for o in outs]   # not int(): a traced export keeps them dynamic
        points, strides, anchors = anchor_grid(hw, STRIDES, cls_logits.dtype, cls_logits.device)
        d = dfl_expectation(dist_logits)
        boxes = torch.cat((points - d[..., :2], points + d[..., 2:]), -1) * strides
        kpts = (offsets + (points - 0.5).unsqueeze(1)) * strides.unsqueeze(1)
        counts = tuple(int(h * w) for h, w in hw)
        decoded = (boxes, cls_logits.sigmoid(), kpts, vis_logits.sigmoid())
        return decoded, (cls_logits, dist_logits, kpts, vis_logits, anchors, points * strides, counts, strides)


class YoloNASPoseNet(YoloNASNet):
    """The whole pose network (see the module docstring)."""

    def __init__(self, size: str = "n", nc: int = 1, num_keypoints: int = COCO_KEYPOINTS):
        if size not in POSE_HEAD_WIDTH:
            raise ValueError(f"unknown YOLO-NAS pose size {size!r}; sizes: {', '.join(POSE_HEAD_WIDTH)}")
        self.num_keypoints = int(num_keypoints)
        super().__init__(size, nc)

    def build_heads(self, cfg: YoloNASConfig, nc: int) -> nn.Module:
        return PoseDFLHeads(self.neck.out_channels, nc, self.num_keypoints, POSE_HEAD_WIDTH[self.size])


__all__ = ["COCO_KEYPOINTS", "CONFIGS", "YoloNASPoseNet"]
