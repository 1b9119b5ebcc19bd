"""PP-YOLOE training loss (task-aligned assignment, VFL + GIoU + DFL), fixed-shape.

The contents of PaddleDetection's ``PPYOLOEHead.get_loss`` with its task-aligned assigner
(``TaskAlignedAssigner(topk=13, alpha=1.0, beta=6.0)``, plain IoU), rewritten on fixed shapes as
the other CNN losses are (targets padded to M rows with a validity mask, nothing read on the
host), so it can be captured in a CUDA graph:

* *Assignment*: YOLOv9's fixed-shape :class:`~libreyolo.models.yolo9.loss.TaskAlignedAssigner`
  with IoU as the overlap: anchors whose centres lie inside a gt, the top 13 by
  ``score^1 * IoU^6``, one gt per anchor (the highest IoU), soft targets normalised per gt so that
  its best anchor gets the gt's best IoU.
* *Classification*: varifocal loss ``BCE(p, t) * w`` with ``w = t`` at the assigned class of a
  foreground anchor and ``0.75 * p^2`` elsewhere (the focal weight not detached, as in the
  original), summed.
* *Regression* (grid units, boxes / stride): ``1 - GIoU`` and DFL over 17 bins (targets clamped to
  ``[0, 16 - 0.01]``), each weighted by the anchor's summed soft target.
* Every term divided by ``max(sum of the soft targets, 1)``; ``loss = 1.0 * cls + 2.5 * iou + 0.5 *
  dfl``, the original's scale (not multiplied by the batch size).

The original starts with a static ATSS assigner for its first 4 epochs (of 300); here the
task-aligned assigner runs from the first step, so nothing changes between epochs.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...ops.iou import bbox_giou, bbox_iou
from ..common.assign import cached, grid_key
from ..yolo9.loss import TaskAlignedAssigner, bbox_to_dist, distribution_focal_loss
from .nn import REG_MAX

IOU_EPS = 1e-9     # eps of PaddleDetection's batch_iou_similarity (the assigner's IoU)
GIOU_EPS = 1e-10   # eps of PaddleDetection's GIoULoss


def _assign_iou(box1: Tensor, box2: Tensor) -> Tensor:
    return bbox_iou(box1, box2, eps=IOU_EPS)


def varifocal_loss(logits: Tensor, target: Tensor, label: Tensor, alpha: float = 0.75, gamma: float = 2.0
                   ) -> Tensor:
    """PP-YOLOE's VFL, elementwise: ``BCE(sigmoid(x), t) * (alpha * p^gamma * (1 - label) + t * label)``
    with ``label`` the one-hot class of foreground anchors (0 elsewhere)."""
    weight = alpha * logits.sigmoid().pow(gamma) * (1 - label) + target * label
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") * weight


class PPYoloELoss(nn.Module):
    """The PP-YOLOE loss on the network's raw tuple; CUDA-graph capturable.

    ``forward(raw, targets, mask)``: ``raw`` is ``PPYoloENet``'s training output ``(cls_logits (B,
    N, nc), reg_logits (B, N, 4 * 17), anchors, anchor_points (N, 2) pixels, counts, stride (N,
    1))``, ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels padded to M rows, ``mask``
    (B, M) bool. Returns ``(loss, items)`` with ``items = [box (GIoU), cls (VFL), dfl]`` (weights
    applied) and ``loss`` their sum. Computed in float32, autocast off.
    """

    item_names = ("box", "cls", "dfl")
    #: distributed runs: each rank divides by the global soft-target sum (its share of the loss);
    #: the ranks' gradients are summed (libreyolo.distributed)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, reg_max: int = REG_MAX, topk: int = 13, alpha: float = 1.0, beta: float = 6.0,
                 cls_weight: float = 1.0, iou_weight: float = 2.5, dfl_weight: float = 0.5):
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        self.cls_weight, self.iou_weight, self.dfl_weight = cls_weight, iou_weight, dfl_weight
        self.assigner = TaskAlignedAssigner(nc, topk=topk, alpha=alpha, beta=beta, iou=_assign_iou)
        self._bins: dict = {}

    def bins(self, device: torch.device | str) -> Tensor:
        key = grid_key([(1, 1)], 1, device)
        return cached(self._bins, key, lambda: (torch.arange(self.reg_max + 1, dtype=torch.float32,
                                                             device=key[2]),))[0]

    def forward(self, raw: Sequence, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        cls_logits, reg_logits, _, points, _, strides = raw
        with torch.autocast(device_type=cls_logits.device.type, enabled=False):
            targets, mask = targets.float(), mask.bool()
            if targets.shape[1] == 0:   # shape-level (static) decision: one all-padding row
                targets, mask = targets.new_zeros(targets.shape[0], 1, 5), mask.new_zeros(mask.shape[0], 1)
            return self._compute(cls_logits.float(), reg_logits.float(), points.float(), strides.float(),
                                 targets, mask)

    def _compute(self, cls_logits: Tensor, reg_logits: Tensor, points: Tensor, strides: Tensor,
                 targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        b, n, nc = cls_logits.shape
        r = self.reg_max + 1
        if nc != self.nc:
            raise ValueError(f"class logits have {nc} channels, expected {self.nc}")
        if reg_logits.shape[-1] != 4 * r:
            raise ValueError(f"box logits have {reg_logits.shape[-1]} channels, expected 4*{r}")
        dist_logits = reg_logits.reshape(b, n, 4, r)
        dist = (dist_logits.softmax(-1) * self.bins(cls_logits.device)).sum(-1)      # (B, N, 4) grid units
        centres = points / strides                                                   # (N, 2) grid units
        pred = torch.cat((centres - dist[..., :2], centres + dist[..., 2:]), -1)     # (B, N, 4) grid units

        labels, target_boxes, target_scores, fg = self.assigner(
            cls_logits.detach().sigmoid(), pred.detach() * strides, points,
            targets[..., 0], targets[..., 1:5], mask)
        target_boxes = target_boxes / strides
        fgf = fg.to(cls_logits.dtype)
        score_sum = global_sum(target_scores.sum()).clamp_min(1.0)

        one_hot = F.one_hot(labels, nc).to(cls_logits.dtype) * fgf.unsqueeze(-1)
        loss_cls = varifocal_loss(cls_logits, target_scores, one_hot).sum() / score_sum

        # off the foreground the prediction is swapped for its constant target: nothing stray
        # (a degenerate box) reaches the gradient, and the weight is 0 there anyway
        weight = target_scores.sum(-1) * fgf                                         # (B, N)
        pred_fg = torch.where(fg.unsqueeze(-1), pred, target_boxes)
        loss_iou = ((1.0 - bbox_giou(pred_fg, target_boxes, GIOU_EPS)) * weight).sum() / score_sum
        target_ltrb = bbox_to_dist(centres, target_boxes, r)
        dfl = distribution_focal_loss(dist_logits, target_ltrb).mean(-1)              # (B, N)
        loss_dfl = (dfl * weight).sum() / score_sum

        items = torch.stack((loss_iou * self.iou_weight, loss_cls * self.cls_weight, loss_dfl * self.dfl_weight))
        return items.sum(), items.detach()
