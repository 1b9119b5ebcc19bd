"""YOLO-NAS-R training loss (SuperGradients' ``YoloNASRLoss``), fixed-shape.

The head (:mod:`.obb_nn`) predicts per anchor class logits, width and height as DFL
distributions (2 x 17 bins, in strides), a centre offset from the anchor point (in strides) and
the angle ``(sigmoid(rot) - 0.25) * pi``. The loss decodes them as the head does - centre
``(offset + anchor) * stride``, size ``E[dist] * stride``, the angle as given - to rotated boxes
(cx, cy, w, h, angle) in input pixels, and trains them with:

* *Assignment*: the task-aligned assigner of the detector (:class:`.loss.TaskAlignedAssigner`,
  top 12 as the reference's recipe, alpha 1, beta 6, eps 1e-9) on rotated geometry: metric =
  score(gt class) * ProbIoU(gt, prediction)^6 over the anchors whose centres lie inside the
  rotated gt box; each gt takes its 12 best; an anchor claimed by several gts goes to the gt of
  highest ProbIoU; soft targets are the metric normalised per gt so that its best anchor gets
  the gt's best ProbIoU.
* *Classification*: varifocal loss (alpha 0.75, gamma 2) against the soft targets, weight 1.
* *Boxes* on the positives, weighted by their soft-target sums: ``1 - ProbIoU`` (weight 2.5; the
  probabilistic IoU of the boxes' Gaussians, :func:`~libreyolo.tasks.obb.rotated.probiou`) - the
  only term that sees the centre offset and the angle - and DFL on the width and height in
  strides, clamped to ``[0, reg_max - 0.01]``, averaged over the two (weight 0.1).
* Every term divided by ``max(sum of the soft targets, 1)`` (over all ranks when distributed).

Targets are the obb task's (:func:`libreyolo.tasks.obb.data.collate_obb`): classes (B, M), boxes
(B, M, 5) as cx, cy, w, h normalized to the square input and the angle in radians (longer side
first, angle in [0, pi)), and the (B, M) mask; the network's outputs come with the input's
(height, width) (:meth:`.obb.YoloNASOBB.train_forward`). ProbIoU is invariant to turning a box by
pi and to swapping its sides while turning it by pi / 2, so the head's angle range [-pi/4, 3pi/4)
reaches every target and no angle-wrapping term is needed. Nothing is read back on the host and
every shape is fixed by the padded target count, so the step could be captured in a CUDA graph.

Deliberate differences from the reference:

* candidate anchors are those inside the rotated gt box; the reference takes the disc of radius
  ``min(w, h) / 2`` around the centre, which leaves an elongated object (DOTA's ships, bridges,
  harbours) a handful of anchors or none at the finer strides;
* ProbIoU is the obb task's (eps 1e-7, the Bhattacharyya distance clamped to [eps, 100], ``1 -
  sqrt(1 - exp(-d) + eps)``); the reference's (eps 1e-5, also inside the determinants' square
  root, clamped to 10, ``1 - sqrt(-expm1(-d))``) differs from it by up to about 1e-3 for boxes
  with sides of 2 to 10 px (where its eps weighs) and 1e-4 for larger ones;
* images are assigned together on padded targets rather than one at a time (the same result).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...tasks.obb.rotated import probiou
from .loss import DFL_MARGIN, TaskAlignedAssigner, distribution_focal_loss, varifocal_loss
from .nn import REG_MAX

#: the reference recipe's assigner top-k (``bbox_assigner_topk: 12``)
TOPK = 12


def points_in_rboxes(points: Tensor, rboxes: Tensor, eps: float = 0.0) -> Tensor:
    """(N, 2) points and (B, M, 5) rotated boxes (cx, cy, w, h, angle) -> (B, M, N) bool: the point
    lies more than ``eps`` inside every edge of the box (its offset from the centre, turned into the
    box's axes, within half of each side)."""
    c = rboxes[..., None, :2]                                                        # (B, M, 1, 2)
    cos, sin = rboxes[..., 4:5].cos(), rboxes[..., 4:5].sin()                         # (B, M, 1)
    d = points - c                                                                   # (B, M, N, 2)
    along = d[..., 0] * cos + d[..., 1] * sin
    across = d[..., 1] * cos - d[..., 0] * sin
    return torch.minimum(rboxes[..., 2:3] / 2 - along.abs(), rboxes[..., 3:4] / 2 - across.abs()) > eps


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """The task-aligned assigner on rotated boxes (cx, cy, w, h, angle): ProbIoU as the overlap,
    the rotated box as the candidate region."""

    def overlaps(self, gt_boxes: Tensor, pd_boxes: Tensor) -> Tensor:
        return probiou(gt_boxes.unsqueeze(2), pd_boxes.unsqueeze(1))

    def inside(self, points: Tensor, gt_boxes: Tensor) -> Tensor:
        return points_in_rboxes(points, gt_boxes, self.eps)


def decode_rboxes(raw: dict, reg_max: int = REG_MAX) -> tuple[Tensor, Tensor]:
    """The head's raw outputs -> (rotated boxes (B, N, 5) in input pixels, float32; the size
    distribution logits (B, N, 2, reg_max + 1)), decoded as :mod:`.obb_nn` does."""
    dist = raw["size_dist"].float()
    b, n, _ = dist.shape
    dist = dist.reshape(b, n, 2, reg_max + 1)
    bins = torch.arange(reg_max + 1, dtype=dist.dtype, device=dist.device)
    size = (dist.softmax(-1) * bins).sum(-1)                                         # (B, N, 2) strides
    points, strides = raw["anchor_points"].float(), raw["strides"].float()
    centre = (raw["offsets"].float() + points) * strides
    return torch.cat((centre, size * strides, raw["angles"].float()), -1), dist


class YoloNASOBBLoss(nn.Module):
    """``loss(outputs, cls, boxes, mask) -> (loss, items)`` (see the module docstring); ``outputs``
    is ``(network outputs, (height, width))``; ``items = [cls, iou, dfl]`` with the weights
    applied, ``loss`` their sum. Computed in float32, autocast off."""

    item_names = ("cls", "iou", "dfl")
    #: distributed runs: each rank divides by the global soft-target sum; gradients are summed
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, reg_max: int = REG_MAX, topk: int = TOPK, alpha: float = 1.0, beta: float = 6.0,
                 cls_weight: float = 1.0, iou_weight: float = 2.5, dfl_weight: float = 0.1):
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        self.weights = (cls_weight, iou_weight, dfl_weight)
        self.assigner = RotatedTaskAlignedAssigner(topk, alpha, beta)

    def forward(self, outputs, cls: Tensor, boxes: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        out, (h, w) = outputs
        raw = out[1]
        if int(h) != int(w):
            raise ValueError(f"oriented-box training takes square inputs (the boxes are normalized to one side), "
                             f"got {int(h)}x{int(w)}")
        if boxes.shape[-1] != 5:
            raise ValueError(f"oriented-box targets have 5 values per row (cx, cy, w, h, angle), got {boxes.shape[-1]}")
        with torch.autocast(device_type=raw["score_logits"].device.type, enabled=False):
            if cls.shape[1] == 0:   # a shape-level (static) decision: one all-padding row
                b = cls.shape[0]
                cls, boxes, mask = cls.new_zeros(b, 1), boxes.new_zeros(b, 1, 5), mask.new_zeros(b, 1)
            boxes = boxes.float()
            gt = torch.cat((boxes[..., :4] * float(w), boxes[..., 4:]), -1)            # input pixels, radians
            items = self._compute(raw, cls, gt, mask.bool())
            return items.sum(), items.detach()

    def _compute(self, raw: dict, gt_cls: Tensor, gt_boxes: Tensor, mask: Tensor) -> Tensor:
        logits = raw["score_logits"].float()
        b, n, nc = logits.shape
        if nc != self.nc:
            raise ValueError(f"class logits have {nc} channels, expected {self.nc}")
        if raw["size_dist"].shape[-1] != 2 * (self.reg_max + 1):
            raise ValueError(f"size distribution logits have {raw['size_dist'].shape[-1]} channels, "
                             f"expected 2*{self.reg_max + 1}")
        pred, dist = decode_rboxes(raw, self.reg_max)
        strides = raw["strides"].float()
        points_px = raw["anchor_points"].float() * strides

        labels, boxes, scores, fg, _ = self.assigner(logits.detach().sigmoid(), pred.detach(), points_px,
                                                     gt_cls, gt_boxes, mask)
        norm = global_sum(scores.sum()).clamp_min(1.0)
        fgf = fg.to(scores.dtype)
        onehot = F.one_hot(labels, nc).to(scores.dtype) * fgf.unsqueeze(-1)
        loss_cls = varifocal_loss(logits, scores, onehot).sum() / norm

        weight = scores.sum(-1) * fgf                                                 # (B, N), 0 off foreground
        # off the foreground the prediction is swapped for its target: nothing stray reaches the gradient
        pred_fg = torch.where(fg.unsqueeze(-1), pred, boxes)
        loss_iou = ((1.0 - probiou(pred_fg, boxes)) * weight).sum() / norm
        wh = (boxes[..., 2:4] / strides).clamp(0, self.reg_max - DFL_MARGIN)
        loss_dfl = (distribution_focal_loss(dist, wh).mean(-1) * weight).sum() / norm

        return torch.stack([t * wt for t, wt in zip((loss_cls, loss_iou, loss_dfl), self.weights)])


__all__ = ["RotatedTaskAlignedAssigner", "YoloNASOBBLoss", "decode_rboxes", "points_in_rboxes"]
