"""PicoDet training loss (SimOTA assignment, VFL + GIoU + DFL), fixed-shape.

Which PicoDet: our network is the original (2021, "legacy") PicoDet - ESNet backbone, CSP-PAN with
a stride-64 level, and ``PicoHead`` with ``share_cls_reg`` (one 1x1 conv per level predicting the
classes and the 4 x (reg_max + 1 = 8) box distribution bins), cells at offset 0.5. That head
trains, in PaddleDetection's ``picodet_esnet`` configs (and in the LibreYOLO reference), with
``OTAVFLHead.get_loss``: ``SimOTAAssigner(center_radius 2.5, candidate_topk 10, iou_weight 6,
VFL-based class cost)``, ``VarifocalLoss(alpha 0.75, gamma 2, iou_weighted, weight 1)``,
``GIoULoss(weight 2.0)`` and ``DistributionFocalLoss(weight 0.25)``. The later PicoDet v2 recipe
(``PicoHeadV2``: static ATSS warm-up then TaskAlignedAssigner, GIoU 2.5, DFL 0.5) belongs to the
LCNet/LCPAN head with an extra alignment branch, which our network does not have; its loss would
not match this head, so the v1 recipe is implemented and nothing changes between epochs.

Everything is rewritten on fixed shapes (targets padded to M rows with a validity mask; nothing
read back on the host), so it can be captured in a CUDA graph with the network:

* *Candidates*: priors inside any real gt box or inside any real gt's centre square (2.5 strides
  each way); the cost is built for all (gt, prior) pairs and +inf marks non-candidates/padding.
  Pairs not both in that gt's box and centre square get the original's +1e8.
* *Cost*: VFL of the prior's class probabilities against the one-hot gt class scaled by the IoU,
  summed over classes (computed as the all-negative sum with the gt's class swapped, in
  ``O(B * N * (C + M))`` memory), + 6 * (1 - GIoU) + 1e8 * not(in box and in centre).
  The cost is summed in float64: the original's float32 sum rounds ``cost + 1e8`` to multiples
  of 8, which makes the choice among centre-square-only candidates (objects smaller than a cell)
  arbitrary; in float64 the 1e8 is the priority it was meant to be (same picks otherwise).
* *Dynamic k*: ``max(1, floor(sum of the 10 best candidate IoUs))`` via one ``topk(10)`` and a
  ``rank < k`` mask; a prior taken by several gts goes to the gt of least cost.
* *Normalisation*: VFL / ``max(sum over images of pos_num, 1)`` with ``pos_num = max(#positives,
  1)`` for an image with objects and 0 without (the original's count); GIoU and DFL weighted by the
  positive's best class score (detached) and divided by ``max(sum of those weights, 1)``. Regression
  runs in grid units (boxes / stride), DFL targets clamped to ``[0, reg_max - 0.1]``.

Box convention (``PicodetNet`` / ``Picodet.infer``): cell centres ``((col + 0.5) * s, (row + 0.5)
* s)``; distances are the softmax expectation over bins 0..7 in grid units, times the stride.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...ops.iou import bbox_giou, bbox_overlaps
from ..common.assign import (
    DenseMapsLoss,
    cached,
    class_cost,
    dynamic_k_matching,
    gather_classes,
    grid_key,
    points_in_boxes,
    points_near_centres,
    prior_grid,
    sanitize_targets,
)
from .nn import REG_MAX, STRIDES

IOU_EPS = 1e-6          # eps of PaddleDetection's bbox_overlaps (assigner IoU/GIoU and the VFL target)
GIOU_EPS = 1e-10        # eps of PaddleDetection's GIoULoss (added to the union and the enclosing area)
OUTSIDE_COST = 1e8      # SimOTA: a pair not in both the gt box and its centre square
DFL_MARGIN = 0.1        # bbox2distance clamps DFL targets to reg_max - 0.1


def varifocal_loss(logits: Tensor, target: Tensor, alpha: float = 0.75, gamma: float = 2.0) -> Tensor:
    """Elementwise VFL (iou-weighted): ``BCE(x, t) * t`` where ``t > 0``, else ``BCE(x, t) * alpha *
    |sigmoid(x) - t|^gamma``. The focal weight is not detached (as in the original)."""
    p = logits.sigmoid()
    pos = (target > 0).to(logits.dtype)
    weight = target * pos + alpha * (p - target).abs().pow(gamma) * (1 - pos)
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") * weight


def distribution_focal_loss(logits: Tensor, target: Tensor) -> Tensor:
    """DFL: ``(r - t) * CE(bin l) + (t - l) * CE(bin r)`` with ``l = floor(t)``, ``r = l + 1``.

    ``logits`` (..., reg_max + 1), ``target`` (...) in ``[0, reg_max)``; returns (...).
    """
    logp = logits.log_softmax(-1)
    left = target.long().clamp(0, logits.shape[-1] - 2)   # target >= 0, so .long() is floor
    right = left + 1
    w_left = right.to(target.dtype) - target
    w_right = target - left.to(target.dtype)
    return (-logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * w_left
            - logp.gather(-1, right.unsqueeze(-1)).squeeze(-1) * w_right)


class SimOTAAssigner(nn.Module):
    """PicoDet's SimOTA (VFL class cost), fixed-shape and sync-free."""

    def __init__(self, nc: int, center_radius: float = 2.5, topk: int = 10, iou_weight: float = 6.0,
                 cls_weight: float = 1.0, alpha: float = 0.75, gamma: float = 2.0):
        super().__init__()
        self.nc, self.center_radius, self.topk = nc, center_radius, topk
        self.iou_weight, self.cls_weight, self.alpha, self.gamma = iou_weight, cls_weight, alpha, gamma

    @torch.no_grad()
    def forward(self, pd_scores: Tensor, pd_boxes: Tensor, points: Tensor, strides: Tensor,
                gt_labels: Tensor, gt_boxes: Tensor, mask_gt: Tensor
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Assign targets.

        Args: ``pd_scores`` (B, N, nc) class probabilities, ``pd_boxes`` (B, N, 4) xyxy, ``points``
        (N, 2) cell centres and ``strides`` (N, 1) (same units as the boxes), ``gt_labels`` (B, M),
        ``gt_boxes`` (B, M, 4) xyxy, ``mask_gt`` (B, M) bool. Returns ``fg`` (B, N) bool,
        ``labels`` (B, N) long, ``boxes`` (B, N, 4) and ``pos_num`` (B,): the original's per-image
        positive count, ``max(#fg, 1)`` for an image with objects and 0 without.
        """
        b, n, nc = pd_scores.shape
        dtype = pd_scores.dtype
        valid, labels, boxes = sanitize_targets(gt_labels, gt_boxes, mask_gt, nc, dtype)

        in_box = points_in_boxes(points, boxes.unsqueeze(2))                               # (B, M, N)
        in_centre = points_near_centres(points, boxes, self.center_radius * strides)
        candidate = ((in_box | in_centre) & valid.unsqueeze(-1)).any(1)                     # (B, N)

        ious = bbox_overlaps(pd_boxes.unsqueeze(1), boxes.unsqueeze(2), eps=IOU_EPS)       # (B, M, N)
        gious = bbox_overlaps(pd_boxes.unsqueeze(1), boxes.unsqueeze(2), mode="giou", eps=IOU_EPS)

        # VFL class cost on probabilities: each class's all-negative term, except the gt's class
        # whose target is the IoU (an IoU of 0 leaves it negative, as the original's t > 0 test).
        p = pd_scores
        neg = F.binary_cross_entropy(p, torch.zeros_like(p), reduction="none") * self.alpha * p.pow(self.gamma)
        p_l = gather_classes(p, labels)                                                     # (B, M, N)
        pos_l = F.binary_cross_entropy(p_l, ious, reduction="none") * ious
        cls_cost = class_cost(neg, labels, torch.where(ious > 0, pos_l, gather_classes(neg, labels)))

        # float64: in float32 the +1e8 rounds the cost to multiples of 8, so among candidates
        # that are only in a centre square (small objects) the pick would be arbitrary
        cost = ((cls_cost * self.cls_weight + (1.0 - gious) * self.iou_weight).double()
                + (~(in_box & in_centre)).double() * OUTSIDE_COST)
        _, fg, gt_idx = dynamic_k_matching(cost, ious, candidate, valid, self.topk)
        target_labels = labels.gather(1, gt_idx)
        target_boxes = boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, n, 4))
        pos_num = torch.where(valid.any(1), fg.sum(1).clamp_min(1), 0)
        return fg, target_labels, target_boxes, pos_num


class PicodetLoss(DenseMapsLoss):
    """The PicoDet (v1) loss on the train-mode head outputs; CUDA-graph capturable.

    ``forward(outputs, targets, mask)``: ``outputs`` is ``PicodetNet``'s ``(cls_scores,
    bbox_preds)`` (per stride: class logits (B, nc, H, W) and distribution logits
    (B, 4 * (reg_max + 1), H, W), side-major), ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in
    input pixels padded to M rows, ``mask`` (B, M) bool. Returns ``(loss, items)`` with ``items =
    [vfl, giou, dfl]`` (weights applied) and ``loss`` their sum, the original's scale (normalised
    by the positives, not multiplied by the batch size). Computed in float32, autocast off.
    """

    item_names = ("vfl", "giou", "dfl")
    #: distributed runs: each rank divides by the global positive count and score sum (its share
    #: of the loss); the ranks' gradients are summed (libreyolo.distributed)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, reg_max: int = REG_MAX, strides: Sequence[int] = STRIDES,
                 center_radius: float = 2.5, topk: int = 10, iou_weight: float = 6.0,
                 alpha: float = 0.75, gamma: float = 2.0, vfl_weight: float = 1.0,
                 giou_weight: float = 2.0, dfl_weight: float = 0.25):
        super().__init__()
        self.nc, self.reg_max, self.strides = nc, reg_max, tuple(int(s) for s in strides)
        self.alpha, self.gamma = alpha, gamma
        self.vfl_weight, self.giou_weight, self.dfl_weight = vfl_weight, giou_weight, dfl_weight
        self.assigner = SimOTAAssigner(nc, center_radius, topk, iou_weight, alpha=alpha, gamma=gamma)
        self._grid_cache: dict = {}

    def prepare(self, maps_shapes: Iterable[Sequence[int]], device: torch.device | str
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Build (or fetch) the cached cell centres (N, 2) in pixels, strides (N, 1) and bins
        (reg_max + 1,) for these map shapes (last two entries (H, W)); call before CUDA capture."""
        key = grid_key(maps_shapes, len(self.strides), device)
        hw, dtype, device = key

        def build():
            points, strides = prior_grid(hw, self.strides, 0.5, True, dtype, device)
            return points, strides, torch.arange(self.reg_max + 1, dtype=dtype, device=device)
        return cached(self._grid_cache, key, build)

    def _compute(self, cls_maps: list[Tensor], box_maps: list[Tensor], targets: Tensor,
                 mask: Tensor) -> tuple[Tensor, Tensor]:
        b, nc = cls_maps[0].shape[:2]
        r = self.reg_max + 1
        if nc != self.nc:
            raise ValueError(f"class maps have {nc} channels, expected {self.nc}")
        if box_maps[0].shape[1] != 4 * r:
            raise ValueError(f"box maps have {box_maps[0].shape[1]} channels, expected 4*{r}")
        points, strides, bins = self.prepare([c.shape for c in cls_maps], cls_maps[0].device)

        logits = torch.cat([c.flatten(2) for c in cls_maps], 2).transpose(1, 2)          # (B, N, nc)
        dist_logits = torch.cat([d.reshape(b, 4, r, -1) for d in box_maps], 3).permute(0, 3, 1, 2)  # (B, N, 4, r)
        dist = (dist_logits.softmax(-1) * bins).sum(-1)                                  # (B, N, 4) grid units
        centres = points / strides                                                       # (N, 2) grid units
        pred = torch.cat((centres - dist[..., :2], centres + dist[..., 2:]), -1)         # (B, N, 4) grid units

        scores = logits.detach().sigmoid()
        fg, labels, boxes, pos_num = self.assigner(scores, pred.detach() * strides, points, strides,
                                                   targets[..., 0], targets[..., 1:5], mask)
        fgf = fg.to(logits.dtype)
        target = boxes / strides                                                         # grid units

        # classification: VFL against the IoU of the (detached) prediction, at the gt class
        iou = bbox_overlaps(pred.detach(), target, eps=IOU_EPS) * fgf                    # (B, N)
        score = F.one_hot(labels, nc).to(logits.dtype) * iou.unsqueeze(-1)
        vfl = varifocal_loss(logits, score, self.alpha, self.gamma).sum() / global_sum(pos_num.sum()).clamp_min(1)

        # regression, weighted by the positive's best class score; off the foreground the
        # prediction is swapped for its constant target so nothing stray reaches the gradient
        weight = scores.amax(-1) * fgf                                                   # (B, N)
        avg = global_sum(weight.sum()).clamp_min(1.0)
        pred_fg = torch.where(fg.unsqueeze(-1), pred, target)
        giou = ((1.0 - bbox_giou(pred_fg, target, GIOU_EPS)) * weight).sum() / avg
        ltrb = torch.cat((centres - target[..., :2], target[..., 2:] - centres), -1)
        ltrb = ltrb.clamp(0, self.reg_max - DFL_MARGIN)
        dfl = (distribution_focal_loss(dist_logits, ltrb) * weight.unsqueeze(-1)).sum() / 4.0 / avg

        items = torch.stack((vfl * self.vfl_weight, giou * self.giou_weight, dfl * self.dfl_weight))
        return items.sum(), items.detach()
