"""YOLO-NAS training loss (PP-YOLOE's: task-aligned assignment, VFL + GIoU + DFL), fixed-shape.

The recipe SuperGradients trains YOLO-NAS with (``PPYoloELoss(use_static_assigner=False)``, and
the LibreYOLO reference's port of it):

* *Assignment*: ``TaskAlignedAssigner(topk=13, alpha=1, beta=6)``: metric = score(gt class) *
  IoU(gt, prediction)^6 over the anchors whose centres lie strictly inside the gt box (eps 1e-9);
  each real gt takes its 13 best anchors; an anchor claimed by several gts goes to the gt of
  highest IoU. Soft targets are the one-hot class times the metric normalised per gt so that its
  best anchor gets the gt's best IoU (plain IoU, eps 1e-9).
* *Classification*: varifocal loss ``BCE(x, t) * (alpha * p^gamma * (1 - label) + t * label)``
  (alpha 0.75, gamma 2), ``label`` the one-hot assigned class, ``t`` the soft target.
* *Regression* on the positives, each weighted by its soft target's sum: ``1 - GIoU`` (eps
  1e-10, PaddleDetection's form) and DFL over the 17 bins with the ltrb targets clamped to
  ``[0, reg_max - 0.01]``, averaged over the four sides. Boxes in grid units (pixels / stride).
* *Normalisation*: every term divided by ``max(sum of the soft targets, 1)``; weights 1 (class),
  2.5 (GIoU), 0.5 (DFL); the loss is their sum (not multiplied by the batch size).

Rewritten on fixed shapes (targets padded to M rows with a validity mask, nothing read back on
the host, no boolean indexing), so the step can be captured in a CUDA graph. The static ATSS
warm-up assigner of PP-YOLOE is not used: YOLO-NAS's recipe trains with the task-aligned one from
the first epoch. The same loss is the detection part of the pose loss (:mod:`.pose_loss`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...ops.iou import bbox_giou, bbox_iou
from ..common.assign import (
    gather_classes,
    points_in_boxes,
    resolve_conflicts,
    sanitize_targets,
    topk_mask,
)
from .nn import REG_MAX

ASSIGN_EPS = 1e-9    # eps of PP-YOLOE's assigner (IoU, in-box test, metric normalisation)
DFL_MARGIN = 0.01    # DFL targets clamped to reg_max - 0.01


def varifocal_loss(logits: Tensor, score: Tensor, label: Tensor, alpha: float = 0.75, gamma: float = 2.0
                   ) -> Tensor:
    """PP-YOLOE's elementwise VFL: ``BCE(x, score) * (alpha * sigmoid(x)^gamma * (1 - label) +
    score * label)`` (the focal weight is not detached, as in the original)."""
    weight = alpha * logits.sigmoid().pow(gamma) * (1 - label) + score * label
    return F.binary_cross_entropy_with_logits(logits, score, reduction="none") * weight


def distribution_focal_loss(logits: Tensor, target: Tensor) -> Tensor:
    """DFL: ``(r - t) * CE(bin l) + (t - l) * CE(bin r)`` with ``l = floor(t)``, ``r = l + 1``;
    ``logits`` (..., bins), ``target`` (...) in ``[0, bins - 1)``; returns (...)."""
    logp = logits.log_softmax(-1)
    left = target.long().clamp(0, logits.shape[-1] - 2)   # target >= 0, so .long() is floor
    right = left + 1
    w_left = right.to(target.dtype) - target
    w_right = 1 - w_left
    return (-logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * w_left
            - logp.gather(-1, right.unsqueeze(-1)).squeeze(-1) * w_right)


class TaskAlignedAssigner(nn.Module):
    """PP-YOLOE's task-aligned assigner (see the module docstring), fixed-shape and sync-free.

    The box geometry is two methods, :meth:`overlaps` and :meth:`inside`, so that the rotated-box
    loss (:mod:`.obb_loss`) reuses the rest with five-coordinate boxes."""

    def __init__(self, topk: int = 13, alpha: float = 1.0, beta: float = 6.0, eps: float = ASSIGN_EPS):
        super().__init__()
        self.topk, self.alpha, self.beta, self.eps = topk, alpha, beta, eps

    def overlaps(self, gt_boxes: Tensor, pd_boxes: Tensor) -> Tensor:
        """(B, M, 4) gts and (B, N, 4) predictions, xyxy -> (B, M, N) IoU."""
        return bbox_iou(gt_boxes.unsqueeze(2), pd_boxes.unsqueeze(1), eps=self.eps)

    def inside(self, points: Tensor, gt_boxes: Tensor) -> Tensor:
        """(N, 2) points and (B, M, 4) xyxy gts -> (B, M, N) bool: the point lies inside the gt."""
        return points_in_boxes(points, gt_boxes.unsqueeze(2), self.eps)

    @torch.no_grad()
    def forward(self, pd_scores: Tensor, pd_boxes: Tensor, points: Tensor, gt_labels: Tensor,
                gt_boxes: Tensor, mask_gt: Tensor, quality=None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``pd_scores`` (B, N, nc) probabilities, ``pd_boxes`` (B, N, D) (xyxy here, D = 4),
        ``points`` (N, 2) anchor centres (same units), ``gt_labels`` (B, M), ``gt_boxes`` (B, M, D),
        ``mask_gt`` (B, M) bool; ``quality``: a callable ``(boxes) -> (B, M, N)`` multiplied into
        the IoUs (the pose loss's OKS), given the sanitized gt boxes. Returns ``labels`` (B, N)
        long, ``boxes`` (B, N, D), ``scores`` (B, N, nc) soft targets, ``fg`` (B, N) bool and
        ``gt_idx`` (B, N) long (the assigned gt's row)."""
        b, n, nc = pd_scores.shape
        dtype = pd_scores.dtype
        valid, labels, boxes = sanitize_targets(gt_labels, gt_boxes, mask_gt, nc, dtype)
        ious = self.overlaps(boxes, pd_boxes)                                                 # (B, M, N)
        if quality is not None:
            ious = ious * quality(boxes)
        align = gather_classes(pd_scores, labels).pow(self.alpha) * ious.pow(self.beta)
        in_gts = self.inside(points, boxes).to(dtype)                                         # (B, M, N)
        validf = valid.unsqueeze(-1).to(dtype)
        mask_pos = topk_mask(align * in_gts, self.topk) * in_gts * validf
        best = torch.where(valid.unsqueeze(-1), ious, -1.0).argmax(1, keepdim=True)           # (B, 1, N)
        mask_pos = resolve_conflicts(mask_pos, best)
        fg = mask_pos.sum(1) > 0
        gt_idx = mask_pos.argmax(1)
        target_labels = labels.gather(1, gt_idx)
        target_boxes = boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, n, boxes.shape[-1]))
        onehot = F.one_hot(target_labels, nc).to(dtype) * fg.unsqueeze(-1).to(dtype)
        align = align * mask_pos
        norm = (align / (align.amax(-1, keepdim=True) + self.eps)
                * (ious * mask_pos).amax(-1, keepdim=True)).amax(1)                            # (B, N)
        return target_labels, target_boxes, onehot * norm.unsqueeze(-1), fg, gt_idx


class YoloNASLoss(nn.Module):
    """The PP-YOLOE / YOLO-NAS loss on :class:`~.nn.YoloNASNet`'s raw outputs; CUDA-graph capturable.

    ``forward(outputs, targets, mask)``: ``outputs`` is the network's ``(decoded, raw)`` (or
    ``raw``), ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels padded to M rows,
    ``mask`` (B, M) bool. Returns ``(loss, items)`` with ``items = [cls, iou, dfl]`` (weights
    applied) and ``loss`` their sum. Computed in float32, autocast off.
    """

    item_names = ("cls", "iou", "dfl")
    #: distributed runs: each rank divides by the global soft-target sum (its share of the
    #: loss); the ranks' gradients are summed (libreyolo.distributed)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, reg_max: int = REG_MAX, topk: int = 13, alpha: float = 1.0, beta: float = 6.0,
                 cls_weight: float = 1.0, iou_weight: float = 2.5, dfl_weight: float = 0.5):
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        self.cls_weight, self.iou_weight, self.dfl_weight = cls_weight, iou_weight, dfl_weight
        self.assigner = TaskAlignedAssigner(topk, alpha, beta)

    def forward(self, outputs, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        raw = outputs[1] if len(outputs) == 2 else outputs
        with torch.autocast(device_type=raw[0].device.type, enabled=False):
            targets, mask = targets.float(), mask.bool()
            if targets.shape[1] == 0:   # a shape-level (static) decision: one all-padding row
                targets, mask = targets.new_zeros(targets.shape[0], 1, 5), mask.new_zeros(mask.shape[0], 1)
            items, _ = self.detection_terms(raw, targets[..., 0], targets[..., 1:5], mask)
            return items.sum(), items.detach()

    def detection_terms(self, raw, gt_labels: Tensor, gt_boxes: Tensor, mask: Tensor
                        ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """The three weighted terms (3,) and what the pose loss reuses: ``(fg (B, N) bool, gt_idx
        (B, N) long, weight (B, N) = the positives' soft-target sums / the normaliser)``."""
        cls_logits, dist_logits, _, points_px, _, strides = raw[:6]
        cls_logits, dist_logits = cls_logits.float(), dist_logits.float()
        b, n, nc = cls_logits.shape
        r = self.reg_max + 1
        if nc != self.nc:
            raise ValueError(f"class logits have {nc} channels, expected {self.nc}")
        if dist_logits.shape[-1] != 4 * r:
            raise ValueError(f"distribution logits have {dist_logits.shape[-1]} channels, expected 4*{r}")
        points_px, strides = points_px.float(), strides.float()
        points = points_px / strides                                                     # grid units
        dist_logits = dist_logits.reshape(b, n, 4, r)
        bins = torch.arange(r, dtype=dist_logits.dtype, device=dist_logits.device)
        dist = (dist_logits.softmax(-1) * bins).sum(-1)
        pred = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)           # (B, N, 4) grid units

        labels, boxes, scores, fg, gt_idx = self.assigner(
            cls_logits.detach().sigmoid(), pred.detach() * strides, points_px, gt_labels, gt_boxes, mask)
        target = boxes / strides
        norm = global_sum(scores.sum()).clamp_min(1.0)

        onehot = F.one_hot(labels, nc).to(scores.dtype) * fg.unsqueeze(-1).to(scores.dtype)
        loss_cls = varifocal_loss(cls_logits, scores, onehot).sum() / norm

        weight = scores.sum(-1) * fg.to(scores.dtype)                                    # (B, N), 0 off foreground
        # off the foreground the prediction is swapped for its target: nothing stray reaches the gradient
        pred_fg = torch.where(fg.unsqueeze(-1), pred, target)
        loss_iou = ((1.0 - bbox_giou(pred_fg, target)) * weight).sum() / norm
        ltrb = torch.cat((points - target[..., :2], target[..., 2:] - points), -1).clamp(0, self.reg_max - DFL_MARGIN)
        loss_dfl = (distribution_focal_loss(dist_logits, ltrb).mean(-1) * weight).sum() / norm

        items = torch.stack((loss_cls * self.cls_weight, loss_iou * self.iou_weight, loss_dfl * self.dfl_weight))
        return items, (fg, gt_idx, weight / norm)
