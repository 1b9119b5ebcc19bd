"""RTMDet training loss (dynamic soft-label assignment, QFL + GIoU), fixed-shape.

The contents of mmdetection's RTMDet recipe (``RTMDetHead.loss_by_feat`` with
``DynamicSoftLabelAssigner``, ``QualityFocalLoss(beta=2, weight 1)`` and ``GIoULoss(weight 2)``),
rewritten so that one batch is a fixed sequence of kernels: every tensor's shape follows from the
inputs' shapes and nothing is read back on the host, so the loss can be captured in a CUDA graph
together with the network's forward and backward.

How the data-dependent parts of the original become fixed-shape:

* *Candidates.* The original keeps the priors whose point lies strictly inside any gt and builds
  the cost only for them (against every gt, not only the ones containing them). Here the cost is
  built for all (gt, prior) pairs; pairs with a non-candidate prior or a padded gt get +inf.
* *Dynamic k.* ``k = max(1, floor(sum of the 13 best candidate IoUs))`` is at most 13, so one
  ``topk(13)`` of the cost per gt plus a ``rank < k`` mask replaces the per-gt Python loop.
* *Conflicts.* A prior picked by several gts goes to the gt of least cost over all real gts (the
  original's rule), through ``argmin`` and ``where`` instead of boolean-mask assignment.
* *Soft class cost.* The original materialises ``(priors, gts, classes)``; the class sum is split
  into the prior's all-negative term (shared by every gt) with the gt's own class swapped for its
  soft-label term, which is the same sum in ``O(B * N * (C + M))`` memory.
* Padded target rows are zeroed and masked out; they change nothing (tested).

Differences, all below float noise or outside what training reaches: the soft centre prior
``10 ** (d - 3)`` overflows float32 beyond ~41 strides from a gt centre; such finite-or-inf costs
are clamped to 1e30 so that they still rank before the +inf of non-candidates (ties at that level
were arbitrary in the original too). mmdetection divides its ``avg_factor=1.0`` sums by
``1 + FLT_EPSILON``; that 1e-7 relative factor is left out.

Box convention (``RtmdetNet`` / ``Rtmdet.infer``): prior points at ``(col * s, row * s)`` in input
pixels, the box branch predicts left/top/right/bottom distances in pixels.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...ops.iou import bbox_overlaps
from ..common.assign import (
    DenseMapsLoss,
    cached,
    class_cost,
    dynamic_k_matching,
    gather_classes,
    grid_key,
    points_in_boxes,
    prior_grid,
    sanitize_targets,
)
from .nn import STRIDES, dynamic_masks_batched, resize_bilinear_cuda_backward

IOU_EPS = 1e-6          # eps of mmdetection's BboxOverlaps2D / bbox_overlaps (IoU and GIoU)
LOG_EPS = 1e-7          # EPS of DynamicSoftLabelAssigner (inside -log(iou + EPS))
DICE_EPS = 5e-6         # mmdetection's DiceLoss eps, added to each sum of squares


def quality_focal_loss(logits: Tensor, score: Tensor, positive: Tensor, beta: float = 2.0) -> Tensor:
    """Elementwise QFL: positives ``BCE(x, s) * |s - sigmoid(x)|^beta``, others ``BCE(x, 0) * sigmoid(x)^beta``.

    ``logits``, ``score`` (IoU targets) and the bool ``positive`` broadcast together; the
    modulating factor is not detached (as in the original). Returns the unreduced loss.
    """
    p = logits.sigmoid()
    neg = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none") * p.pow(beta)
    pos = F.binary_cross_entropy_with_logits(logits, score, reduction="none") * (score - p).abs().pow(beta)
    return torch.where(positive, pos, neg)


class DynamicSoftLabelAssigner(nn.Module):
    """RTMDet's dynamic soft-label assignment, fixed-shape and sync-free.

    Candidates: priors whose point lies strictly inside any real gt. Cost of (gt, prior):
    soft-label classification cost (BCE of the prior's logits against the one-hot gt class scaled
    by their IoU, modulated by ``|target - sigmoid|^2``, summed over classes) + ``-log(IoU) *
    iou_weight`` + ``10 ** (centre distance in strides - soft_center_radius)``.
    """

    def __init__(self, nc: int, topk: int = 13, iou_weight: float = 3.0, soft_center_radius: float = 3.0):
        super().__init__()
        self.nc, self.topk, self.iou_weight, self.soft_center_radius = nc, topk, iou_weight, soft_center_radius

    @torch.no_grad()
    def forward(self, pd_logits: Tensor, pd_boxes: Tensor, points: Tensor, strides: Tensor,
                gt_labels: Tensor, gt_boxes: Tensor, mask_gt: Tensor
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`assign` without the gt index."""
        return self.assign(pd_logits, pd_boxes, points, strides, gt_labels, gt_boxes, mask_gt)[:4]

    @torch.no_grad()
    def assign(self, pd_logits: Tensor, pd_boxes: Tensor, points: Tensor, strides: Tensor,
               gt_labels: Tensor, gt_boxes: Tensor, mask_gt: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Assign targets.

        Args: ``pd_logits`` (B, N, nc) class logits, ``pd_boxes`` (B, N, 4) xyxy, ``points``
        (N, 2) and ``strides`` (N, 1) of the priors (same units as the boxes), ``gt_labels`` (B, M),
        ``gt_boxes`` (B, M, 4) xyxy, ``mask_gt`` (B, M) bool. Returns ``fg`` (B, N) bool,
        ``labels`` (B, N) long, ``boxes`` (B, N, 4) and ``ious`` (B, N), the IoU of each
        foreground prediction with its gt (0 off the foreground), and ``gt_idx`` (B, N) long, the
        gt row each foreground prior is assigned to (0 off the foreground).
        """
        b, n, nc = pd_logits.shape
        dtype = pd_logits.dtype
        valid, labels, boxes = sanitize_targets(gt_labels, gt_boxes, mask_gt, nc, dtype)   # (B, M), (B, M, 4)

        inside = points_in_boxes(points, boxes.unsqueeze(2))                               # (B, M, N)
        candidate = (inside & valid.unsqueeze(-1)).any(1)                                  # (B, N)

        centres = (boxes[..., :2] + boxes[..., 2:]) / 2
        dist = (points - centres.unsqueeze(2)).square().sum(-1).sqrt() / strides.view(1, 1, n)
        centre_cost = torch.pow(10.0, dist - self.soft_center_radius)                      # (B, M, N)

        ious = bbox_overlaps(boxes.unsqueeze(2), pd_boxes.unsqueeze(1), eps=IOU_EPS)       # (B, M, N)
        iou_cost = -torch.log(ious + LOG_EPS) * self.iou_weight

        # Soft-label class cost summed over classes: every class contributes its all-negative term
        # except the gt's own class, whose target is the IoU instead of 0.
        x = pd_logits
        neg = F.binary_cross_entropy_with_logits(x, torch.zeros_like(x), reduction="none") * x.sigmoid().square()
        x_l = gather_classes(x, labels)                                                    # (B, M, N)
        pos_l = F.binary_cross_entropy_with_logits(x_l, ious, reduction="none") * (ious - x_l.sigmoid()).square()
        cls_cost = class_cost(neg, labels, pos_l)

        cost = cls_cost + iou_cost + centre_cost
        matching, fg, gt_idx = dynamic_k_matching(cost, ious, candidate, valid, self.topk)
        target_labels = labels.gather(1, gt_idx)
        target_boxes = boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, n, 4))
        return fg, target_labels, target_boxes, (matching * ious).sum(1) * fg.to(dtype), gt_idx


class RtmdetLoss(DenseMapsLoss):
    """The RTMDet loss on the train-mode head outputs; CUDA-graph capturable.

    ``forward(outputs, targets, mask)``: ``outputs`` is ``RtmdetNet``'s ``(cls_scores, bbox_preds)``
    (per stride: class logits (B, nc, H, W) and ltrb pixel distances (B, 4, H, W)), ``targets``
    (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels padded to M rows, ``mask`` (B, M) bool.
    Returns ``(loss, items)`` with ``items = [qfl, giou]`` (weights applied) and ``loss`` their
    sum, the original's scale: both terms are divided by the batch's summed IoU of the assigned
    predictions (at least 1), not multiplied by the batch size. Computed in float32, autocast off.
    """

    item_names = ("qfl", "giou")
    #: distributed runs: each rank divides by the global IoU sum (its share of the loss); the
    #: ranks' gradients are summed (libreyolo.distributed)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, strides: Sequence[int] = STRIDES, topk: int = 13, iou_weight: float = 3.0,
                 soft_center_radius: float = 3.0, beta: float = 2.0, cls_weight: float = 1.0,
                 box_weight: float = 2.0):
        super().__init__()
        self.nc, self.strides = nc, tuple(int(s) for s in strides)
        self.beta, self.cls_weight, self.box_weight = beta, cls_weight, box_weight
        self.assigner = DynamicSoftLabelAssigner(nc, topk, iou_weight, soft_center_radius)
        self._grid_cache: dict = {}

    def prepare(self, maps_shapes: Iterable[Sequence[int]], device: torch.device | str) -> tuple[Tensor, Tensor]:
        """Build (or fetch) the cached prior points (N, 2) and strides (N, 1) in input pixels for
        these map shapes (last two entries (H, W)); call before CUDA capture."""
        key = grid_key(maps_shapes, len(self.strides), device)
        return cached(self._grid_cache, key, lambda: prior_grid(key[0], self.strides, 0.0, True, *key[1:]))

    def _compute(self, cls_maps: list[Tensor], box_maps: list[Tensor], targets: Tensor,
                 mask: Tensor) -> tuple[Tensor, Tensor]:
        items = self._detection(cls_maps, box_maps, targets, mask)[0]
        return items.sum(), items.detach()

    def _detection(self, cls_maps: list[Tensor], box_maps: list[Tensor], targets: Tensor, mask: Tensor):
        """(weighted [qfl, giou] items, fg (B, N), gt_idx (B, N), points (N, 2), strides (N, 1))."""
        b, nc = cls_maps[0].shape[:2]
        if nc != self.nc:
            raise ValueError(f"class maps have {nc} channels, expected {self.nc}")
        points, strides = self.prepare([c.shape for c in cls_maps], cls_maps[0].device)

        logits = torch.cat([c.flatten(2) for c in cls_maps], 2).transpose(1, 2)      # (B, N, nc)
        dist = torch.cat([d.flatten(2) for d in box_maps], 2).transpose(1, 2)        # (B, N, 4)
        pred_boxes = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)  # (B, N, 4) pixels

        fg, labels, boxes, ious, gt_idx = self.assigner.assign(logits.detach(), pred_boxes.detach(), points, strides,
                                                               targets[..., 0], targets[..., 1:5], mask)
        avg = global_sum(ious.sum()).clamp_min(1.0)   # sum of the assigned IoUs (mmdet: cls and bbox avg_factor)

        positive = F.one_hot(labels, nc).bool() & fg.unsqueeze(-1)
        qfl = quality_focal_loss(logits, ious.unsqueeze(-1).expand_as(logits), positive, self.beta).sum() / avg

        # GIoU on the foreground only; elsewhere the prediction is swapped for its (constant)
        # target so that no stray value can reach the gradient through the masked-out branch.
        fg4 = fg.unsqueeze(-1)
        pred_fg = torch.where(fg4, pred_boxes, boxes)
        giou = bbox_overlaps(pred_fg, boxes, mode="giou", eps=IOU_EPS)
        box = ((1.0 - giou) * ious).sum() / avg

        items = torch.stack((qfl * self.cls_weight, box * self.box_weight))
        return items, fg, gt_idx, points, strides


class _DiceTerms(torch.autograd.Function):
    """``(logits, target)`` -> ``(sum(p * t), sum(p * p))`` per mask, ``p`` the sigmoid of the
    logits upsampled x2 (bilinear, the same bits as ``F.interpolate``'s ``scale_factor=2``).

    ``logits`` (B, P, h, w) at the prototypes' stride, ``target`` (B, P, 2h * 2w) flattened, no
    gradient. One function so that the stride-4 work is a few passes: the sigmoid in place, the
    backward ``(g_a t + 2 g_pp p) p (1 - p)`` in place, then the upsample's backward (on CUDA
    :func:`~libreyolo.ops.interpolate.resize_bilinear`'s, free of atomic adds; on the CPU
    torch's own, as autograd calls it). ``sum(p * p)`` is the squared norm (one pass; it
    differs from the plain sum only by rounding).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        h, w = logits.shape[-2:]
        prob = F.interpolate(logits, size=(2 * h, 2 * w), mode="bilinear", align_corners=False).sigmoid_()
        prob = prob.flatten(2)
        ctx.save_for_backward(prob, target)
        ctx.size = (h, w)
        return torch.linalg.vecdot(prob, target), torch.linalg.vector_norm(prob, dim=-1).square()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_inter: Tensor, g_pp: Tensor):
        prob, target = ctx.saved_tensors
        g = (target * g_inter.unsqueeze(-1)).addcmul_(prob, g_pp.unsqueeze(-1), value=2.0)
        g = torch.ops.aten.sigmoid_backward(g, prob)
        h, w = ctx.size
        return resize_bilinear_cuda_backward(g.view(*g.shape[:2], 2 * h, 2 * w), (h, w)), None


class RtmdetInsLoss(RtmdetLoss):
    """The RTMDet-Ins loss: :class:`RtmdetLoss`'s QFL and GIoU on the same assignment, plus the
    dice loss of each foreground prior's mask (its dynamic convs on the prototypes, upsampled
    to stride 4) against its gt's bitmap, averaged over the foreground priors.

    ``forward(outputs, targets, mask, gt_masks)``: ``outputs`` is ``RtmdetInsNet``'s train-mode
    4-tuple, ``gt_masks`` (B, M, S/4, S/4) the instances' bitmaps padded as ``targets``. Fixed
    shapes: the masks are computed for ``min(N, topk * M)`` priors per image - every foreground
    prior fits, as each gt claims at most ``topk`` priors and conflicts only hand a claimed prior
    to one gt - the others weighted out. ``topk * M`` is the tight bound for fixed shapes: a gt
    whose ``topk`` best IoUs are all 1 takes ``topk`` priors.

    The stride-4 work, the bulk of the loss, is kept to a few passes: ``sum(t * t)`` once per gt
    and gathered per prior, each prior's bitmap copied as whole rows, and the upsample, sigmoid,
    ``sum(p * t)``, ``sum(p * p)`` and their backward in one autograd function
    (:class:`_DiceTerms`); the masks' first dynamic conv is one product per image
    (:func:`~.nn.dynamic_masks_batched`). Per prior the dice loss is mmdetection's DiceLoss
    without ``naive_dice``: ``1 - 2 sum(p t) / (sum(p^2) + eps + sum(t^2) + eps)``, ``p`` the
    sigmoid of the upsampled logits; the same as computing each prior's mask by
    :func:`~.nn.dynamic_masks` and that loss on the gathered targets (the formulation before,
    kept in the tests as the reference) up to float rounding (summation order, the squared norm, the first conv's
    split coordinate term): values and gradients agree to 1e-5 relative.
    """

    item_names = ("qfl", "giou", "mask")

    def __init__(self, nc: int, mask_weight: float = 2.0, dice_eps: float = DICE_EPS, **kw):
        super().__init__(nc, **kw)
        self.mask_weight, self.dice_eps = mask_weight, dice_eps

    def forward(self, outputs, targets: Tensor, mask: Tensor, gt_masks: Tensor) -> tuple[Tensor, Tensor]:
        cls_maps, box_maps, kernel_maps, protos = outputs
        with torch.autocast(device_type=cls_maps[0].device.type, enabled=False):
            targets, mask, gt_masks = targets.float(), mask.bool(), gt_masks.float()
            if targets.shape[1] == 0:
                targets, mask = targets.new_zeros(targets.shape[0], 1, 5), mask.new_zeros(mask.shape[0], 1)
                gt_masks = gt_masks.new_zeros(gt_masks.shape[0], 1, *gt_masks.shape[-2:])
            cls_maps, box_maps = [c.float() for c in cls_maps], [d.float() for d in box_maps]
            items, fg, gt_idx, points, strides = self._detection(cls_maps, box_maps, targets, mask)
            kernels = torch.cat([k.float().flatten(2) for k in kernel_maps], 2).transpose(1, 2)   # (B, N, 169)
            n = kernels.shape[1]
            p = min(n, self.assigner.topk * targets.shape[1])
            order = torch.arange(n, device=fg.device, dtype=torch.float32) / n
            sel = (fg.float() * 2 - order).topk(p, dim=1).indices                                 # (B, P)
            valid = fg.gather(1, sel).float()
            params = kernels.gather(1, sel.unsqueeze(-1).expand(-1, -1, kernels.shape[-1]))
            pts = points[sel]                                                                      # (B, P, 2)
            std = strides[:, 0][sel]                                                               # (B, P)
            logits = dynamic_masks_batched(protos.float(), params, pts, std, self.strides[0])
            bitmaps = gt_masks.flatten(2)                                                          # (B, M, HW)
            rows = gt_idx.gather(1, sel)                                                           # (B, P)
            m = bitmaps.shape[1]
            image = torch.arange(rows.shape[0], device=rows.device).unsqueeze(1)
            # each prior's gt bitmap: whole rows copied (index_select), not an elementwise gather
            tgt = bitmaps.flatten(0, 1).index_select(0, (rows + image * m).flatten()).view(*rows.shape, -1)
            inter, pp = _DiceTerms.apply(logits, tgt)                                              # sum(p t), sum(p p)
            tt = torch.linalg.vecdot(bitmaps, bitmaps).gather(1, rows)                             # sum(t t) per gt
            dice = 1 - 2 * inter / (pp + self.dice_eps + tt + self.dice_eps)
            num = global_sum(valid.sum()).clamp_min(1.0)
            mask_loss = (dice * valid).sum() / num * self.mask_weight
            items = torch.cat((items, mask_loss[None]))
            return items.sum(), items.detach()
