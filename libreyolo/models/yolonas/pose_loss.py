"""YOLO-NAS-Pose training loss (SuperGradients' ``YoloNASPoseLoss`` recipe, two terms changed), fixed-shape.

* *Assignment*: the detector's task-aligned assigner (:class:`.loss.TaskAlignedAssigner`, top 13,
  alpha 1, beta 6) on the box IoUs. SuperGradients' recipe multiplies each (gt, prediction) IoU by
  the pose OKS of the prediction's keypoints (scale: 0.53 x the gt box's area; a gt without
  labelled keypoints counts as OKS 1): ``assign_by_oks=True``, off by default - a fresh
  network's keypoints sit at their anchors, so that OKS is about 0 and with it every soft target
  and every positive's weight (class targets of 0.008 on average at initialisation on
  ``shapes-pose``): the run learns nothing in a few hundred steps.
* *Classification*: focal loss on the soft targets, ``BCE(x, t) * |sigmoid(x) - t|^2`` (no alpha).
* *Boxes* on the positives, weighted by their soft-target sums: CIoU (``1 - IoU`` + centre
  distance + aspect term, eps 1e-10) and DFL (weight 0.01), in grid units.
* *Keypoints* on the positives, weighted the same way, in input pixels: ``1 - exp(-d^2 / (2 (2
  sigma)^2 area) )`` averaged over the labelled keypoints (weight 34), and a focal loss (alpha
  0.25, gamma 2) of the visibility logits against "labelled", averaged over the keypoints
  (weight 1); and, not in the recipe, the L1 distance of the labelled keypoints divided by the
  square root of the box area (weight :data:`L1_WEIGHT`): the OKS term is flat for a keypoint a
  few sigmas off (its gradient ``exp(-e)``; at initialisation half of the positives' keypoints
  have ``e > 13``), the L1 term pulls it from anywhere.
* Every term divided by ``max(sum of the soft targets, 1)``.

Targets are the pose task's (:func:`libreyolo.tasks.pose.data.collate_pose`): classes (B, M),
normalized cx, cy, w, h boxes (B, M, 4), normalized keypoints with visibility (B, M, K, 3) and the
(B, M) mask; the network's outputs come with the input's (height, width) (see
:meth:`.pose.YoloNASPose.train_forward`). Nothing is read back on the host.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...ops.iou import cxcywh_to_xyxy
from .loss import DFL_MARGIN, TaskAlignedAssigner, distribution_focal_loss
from .nn import REG_MAX

OKS_AREA = 0.53      # the box area's share that scales OKS (SuperGradients' constant)
EPS = 1e-9
CIOU_EPS = 1e-10
#: weight of the L1 keypoint term (not in SuperGradients' recipe; see the module docstring)
L1_WEIGHT = 10.0
#: SuperGradients' recipe multiplies the assigner's IoUs by the predictions' OKS
#: (``assigner_multiply_by_pose_oks``; see the module docstring)
ASSIGN_BY_OKS = False


def focal_loss(logits: Tensor, target: Tensor, alpha: float = -1.0, gamma: float = 2.0) -> Tensor:
    """Elementwise ``BCE(x, t) * |sigmoid(x) - t|^gamma``, times ``alpha t + (1 - alpha)(1 - t)``
    where ``alpha > 0``."""
    weight = (logits.sigmoid() - target).abs().pow(gamma)
    if alpha > 0:
        weight = weight * (alpha * target + (1 - alpha) * (1 - target))
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") * weight


def ciou_loss(pred: Tensor, target: Tensor, eps: float = CIOU_EPS) -> Tensor:
    """``1 - IoU + centre distance^2 / enclosing diagonal^2 + v * alpha`` (alpha held constant), (...)."""
    px1, py1, px2, py2 = pred.unbind(-1)
    tx1, ty1, tx2, ty2 = target.unbind(-1)
    inter = ((torch.minimum(px2, tx2) - torch.maximum(px1, tx1)).clamp_min(0)
             * (torch.minimum(py2, ty2) - torch.maximum(py1, ty1)).clamp_min(0))
    pw, ph, tw, th = px2 - px1, py2 - py1, tx2 - tx1, ty2 - ty1
    iou = inter / (pw * ph + tw * th - inter + eps)
    diag = (torch.maximum(px2, tx2) - torch.minimum(px1, tx1)).square() + \
        (torch.maximum(py2, ty2) - torch.minimum(py1, ty1)).square()
    dist = ((px1 + px2 - tx1 - tx2).square() + (py1 + py2 - ty1 - ty2).square()) / 4
    v = (4 / math.pi ** 2) * (torch.atan(tw / th.clamp_min(eps)) - torch.atan(pw / ph.clamp_min(eps))).square()
    with torch.no_grad():
        alpha = v / ((1 - iou) + v).clamp_min(eps)
    return 1 - iou + dist / (diag + eps) + v * alpha


def pose_oks(gt: Tensor, pred: Tensor, area: Tensor, sigmas: Tensor) -> Tensor:
    """OKS of every gt pose (B, M, K, 3) with every prediction (B, N, K, 2), scale ``area`` (B, M)
    -> (B, M, N); a gt without labelled keypoints gives 1 (its box still trains)."""
    d2 = (gt[:, :, None, :, :2] - pred[:, None]).square().sum(-1)                      # (B, M, N, K)
    e = d2 / (2 * sigmas).square() / (area[:, :, None, None] + EPS) / 2
    vis = (gt[..., 2] > 0).to(pred.dtype)[:, :, None]                                  # (B, M, 1, K)
    n = vis.sum(-1)
    oks = (torch.exp(-e) * vis).sum(-1) / (n + EPS)
    return torch.where(n > 0, oks, torch.ones_like(oks))


class YoloNASPoseLoss(nn.Module):
    """``loss(outputs, cls, boxes, kpts, mask) -> (loss, items)`` (see the module docstring);
    ``items = [cls, iou, dfl, kpt_vis, kpt_oks, kpt_l1]`` with the weights applied, ``loss`` their
    sum. ``l1_weight=0, assign_by_oks=True`` is SuperGradients' recipe."""

    item_names = ("cls", "iou", "dfl", "kpt_vis", "kpt_oks", "kpt_l1")
    #: distributed runs: the normaliser is the global soft-target sum; gradients are summed
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, sigmas: Sequence[float], reg_max: int = REG_MAX, topk: int = 13,
                 cls_weight: float = 1.0, iou_weight: float = 2.5, dfl_weight: float = 0.01,
                 vis_weight: float = 1.0, oks_weight: float = 34.0, l1_weight: float = L1_WEIGHT,
                 assign_by_oks: bool = ASSIGN_BY_OKS):
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        self.register_buffer("sigmas", torch.as_tensor(list(sigmas), dtype=torch.float32), persistent=False)
        self.weights = (cls_weight, iou_weight, dfl_weight, vis_weight, oks_weight, l1_weight)
        self.assigner = TaskAlignedAssigner(topk)
        self.assign_by_oks = bool(assign_by_oks)

    def forward(self, outputs, cls: Tensor, boxes: Tensor, kpts: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        out, (h, w) = outputs
        raw = out[1]
        with torch.autocast(device_type=raw[0].device.type, enabled=False):
            if cls.shape[1] == 0:   # a shape-level (static) decision: one all-padding row
                b, k = cls.shape[0], kpts.shape[2]
                cls, boxes = cls.new_zeros(b, 1), boxes.new_zeros(b, 1, 4)
                kpts, mask = kpts.new_zeros(b, 1, k, 3), mask.new_zeros(b, 1)
            gt_boxes = cxcywh_to_xyxy(boxes.float()) * _wh(w, h, boxes.device).repeat(2)
            gt_kpts = torch.cat((kpts[..., :2].float() * _wh(w, h, kpts.device), kpts[..., 2:3].float()), -1)
            items = self._compute(raw, cls, gt_boxes, gt_kpts, mask.bool())
            return items.sum(), items.detach()

    def _compute(self, raw, cls: Tensor, gt_boxes: Tensor, gt_kpts: Tensor, mask: Tensor) -> Tensor:
        cls_logits, dist_logits, pred_kpts, vis_logits, _, points_px, _, strides = raw
        cls_logits, dist_logits = cls_logits.float(), dist_logits.float()
        pred_kpts, vis_logits = pred_kpts.float(), vis_logits.float()
        b, n, nc = cls_logits.shape
        k = pred_kpts.shape[2]
        r = self.reg_max + 1
        if nc != self.nc:
            raise ValueError(f"class logits have {nc} channels, expected {self.nc}")
        if k != self.sigmas.numel():
            raise ValueError(f"the network predicts {k} keypoints, the loss has {self.sigmas.numel()} sigmas")
        points_px, strides = points_px.float(), strides.float()
        points = points_px / strides
        dist_logits = dist_logits.reshape(b, n, 4, r)
        bins = torch.arange(r, dtype=dist_logits.dtype, device=dist_logits.device)
        dist = (dist_logits.softmax(-1) * bins).sum(-1)
        pred = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)            # grid units

        valid = mask
        safe_kpts = torch.where(valid[..., None, None], gt_kpts, 0)
        sigmas = self.sigmas.to(pred.device)
        pred_det = pred_kpts.detach()

        def oks_quality(gt_b: Tensor) -> Tensor:
            area = (gt_b[..., 2] - gt_b[..., 0]) * (gt_b[..., 3] - gt_b[..., 1]) * OKS_AREA
            return pose_oks(safe_kpts, pred_det, area, sigmas)

        _, boxes, scores, fg, gt_idx = self.assigner(
            cls_logits.detach().sigmoid(), pred.detach() * strides, points_px, cls, gt_boxes, mask,
            oks_quality if self.assign_by_oks else None)
        norm = global_sum(scores.sum()).clamp_min(1.0)
        fgf = fg.to(scores.dtype)
        loss_cls = focal_loss(cls_logits, scores).sum() / norm

        weight = scores.sum(-1) * fgf                                                     # (B, N)
        target = boxes / strides
        pred_fg = torch.where(fg.unsqueeze(-1), pred, target)
        loss_iou = (ciou_loss(pred_fg, target) * weight).sum() / norm
        ltrb = torch.cat((points - target[..., :2], target[..., 2:] - points), -1).clamp(0, self.reg_max - DFL_MARGIN)
        loss_dfl = (distribution_focal_loss(dist_logits, ltrb).mean(-1) * weight).sum() / norm

        # keypoints of the assigned gt, in input pixels
        tk = safe_kpts.gather(1, gt_idx[..., None, None].expand(b, n, k, 3))               # (B, N, K, 3)
        vis = (tk[..., 2] > 0).to(scores.dtype)                                           # (B, N, K)
        area = ((boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1]) * OKS_AREA)[..., None]
        pk = torch.where(fg[..., None, None], pred_kpts, tk[..., :2])
        e = (pk - tk[..., :2]).square().sum(-1) / (2 * sigmas).square() / (area + EPS) / 2
        per_inst = ((1 - torch.exp(-e)) * vis).sum(-1) / (vis.sum(-1) + EPS)
        loss_oks = (per_inst * weight).sum() / norm
        loss_vis = (focal_loss(vis_logits, vis, alpha=0.25).mean(-1) * weight).sum() / norm
        # the L1 term, in units of the box's size (sqrt of its area)
        scale = (area / OKS_AREA + EPS).sqrt()
        l1 = (((pk - tk[..., :2]).abs().sum(-1) / scale) * vis).sum(-1) / (vis.sum(-1) + EPS)
        loss_l1 = (l1 * weight).sum() / norm

        terms = (loss_cls, loss_iou, loss_dfl, loss_vis, loss_oks, loss_l1)
        return torch.stack([t * wt for t, wt in zip(terms, self.weights)])


def _wh(w: int, h: int, device) -> Tensor:
    """(2,) float32 ``[w, h]`` built on the device by ops (no host tensor copied in: capturable)."""
    return torch.stack((torch.full((), float(w), device=device), torch.full((), float(h), device=device)))
