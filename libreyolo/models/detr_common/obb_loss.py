"""The set criterion of DETR-style oriented-box heads (five-coordinate boxes: cx, cy, w, h
normalized, angle / pi).

Every decoder layer's queries and the selected encoder proposals are matched one-to-one to the
ground truth by the Hungarian algorithm on

    2 * focal class cost + 5 * L1(cx, cy, w, h) + 2 * (1 - ProbIoU)

(ProbIoU: :func:`libreyolo.tasks.obb.rotated.probiou`, the overlap of the boxes' Gaussians, which
takes the place of the horizontal criterion's GIoU and is periodic in the angle: a box and the
same box turned by pi are one box). Each matched set is trained with

* a varifocal class loss (weight 1) whose target for a matched query is its ProbIoU (detached),
* an L1 loss on cx, cy, w, h (weight 5),
* an angle loss ``|sin(angle - target)|`` (weight 1: zero for the same line, periodic in pi),
* a ProbIoU loss ``1 - ProbIoU`` (weight 2),

each normalized by the number of objects. Targets arrive padded to a bucketed row count with a
mask (:func:`libreyolo.tasks.obb.data.collate_obb`): ``cls`` (B, M), ``boxes`` (B, M, 5) as cx, cy,
w, h normalized to the input and the angle in radians; padded rows never enter a cost or a loss.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .loss import varifocal_loss
from .matcher import hungarian_assign

W_CLASS, W_L1, W_ANGLE, W_PROBIOU = 1.0, 5.0, 1.0, 2.0
C_CLASS, C_L1, C_PROBIOU = 2.0, 5.0, 2.0


def to_xywhr(boxes: Tensor) -> Tensor:
    """Network boxes (..., 5) with the angle as a fraction of pi -> radians."""
    return torch.cat((boxes[..., :4], boxes[..., 4:5] * math.pi), -1)


class RotatedSetLoss(nn.Module):
    """``loss(outputs, cls, boxes, mask) -> (loss, items)``; ``outputs`` is the network's training
    dict (``pred_logits``, ``pred_boxes`` (B, Q, 5), ``aux_outputs``, ``enc_outputs``)."""

    item_names = ("cls_loss", "l1_loss", "angle_loss", "probiou_loss")

    def __init__(self, nc: int, alpha: float = 0.75, gamma: float = 2.0):
        super().__init__()
        self.nc, self.alpha, self.gamma = nc, alpha, gamma

    @staticmethod
    def _cost(out: dict, cls: Tensor, gt: Tensor) -> Tensor:
        from ...tasks.obb.rotated import probiou
        logits = out["pred_logits"].float()
        q = logits.shape[1]
        pred = to_xywhr(out["pred_boxes"].float())
        p = logits.sigmoid().gather(2, cls[:, None, :].expand(-1, q, -1))             # (B, Q, M)
        a, g = 0.25, 2.0
        c_cls = a * (1 - p) ** g * -(p + 1e-8).log() - (1 - a) * p ** g * -(1 - p + 1e-8).log()
        l1 = (pred[:, :, None, :4] - gt[:, None, :, :4]).abs().sum(-1)
        iou = probiou(pred[:, :, None], gt[:, None])
        return C_CLASS * c_cls + C_L1 * l1 + C_PROBIOU * (1 - iou)

    def _set_loss(self, out: dict, assign: Tensor, cls: Tensor, gt: Tensor, n: Tensor) -> Tensor:
        from ...tasks.obb.rotated import probiou
        logits = out["pred_logits"].float()
        pred = to_xywhr(out["pred_boxes"].float())
        matched = assign >= 0                                                          # (B, Q)
        idx = assign.clamp(min=0)
        tgt = gt.gather(1, idx[..., None].expand(-1, -1, 5))
        t_cls = cls.gather(1, idx)
        w = matched.float()
        iou = probiou(pred, tgt)
        l1 = ((pred[..., :4] - tgt[..., :4]).abs().sum(-1) * w).sum() / n
        angle = ((pred[..., 4] - tgt[..., 4]).sin().abs() * w).sum() / n
        iou_loss = ((1 - iou) * w).sum() / n
        cls_loss = varifocal_loss(logits, t_cls, iou.detach(), matched, alpha=self.alpha, gamma=self.gamma) / n
        return torch.stack([W_CLASS * cls_loss, W_L1 * l1, W_ANGLE * angle, W_PROBIOU * iou_loss])

    def forward(self, outputs: dict, cls: Tensor, boxes: Tensor, mask: Tensor):
        cls = cls.long() * mask.long()
        gt = boxes.float() * mask[..., None].float()
        gt = torch.where(mask[..., None], gt, torch.full_like(gt, 0.5))     # padded rows: a harmless box
        n = mask.sum().clamp(min=1).float()
        sets = [outputs, *outputs.get("aux_outputs", [])]
        if "enc_outputs" in outputs:
            sets.append(outputs["enc_outputs"])
        with torch.no_grad():
            costs = torch.stack([self._cost(o, cls, gt) for o in sets])
        assign, _ = hungarian_assign(costs, mask)
        total = sum(self._set_loss(o, assign[i], cls, gt, n) for i, o in enumerate(sets))
        return total.sum(), total.detach()
