"""YOLOv9 training loss (task-aligned assignment, BCE + CIoU + DFL), fixed-shape.

Same contents as the original YOLOv9 TAL loss (WongKinYiu/yolov9, ``utils/loss_tal.py`` and
``utils/tal/assigner.py``), rewritten so that it can be captured in a CUDA graph: every tensor
has a shape fixed by the inputs' shapes and nothing reads a tensor value on the host (no scalar
read-backs, boolean-mask indexing or data-dependent branches). Targets come padded to a fixed
``M`` with a validity mask; padded rows are zeroed before use and weighted out, so they
contribute nothing.

Conventions follow ``DetectHead.decode``: anchor centres at (col + 0.5, row + 0.5) in grid units,
ltrb distances are the softmax expectation over ``reg_max`` bins, boxes = (anchor -/+ dist) * stride.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_batch, global_sum
from ...ops.iou import bbox_ciou  # the original's CIoU (eps 1e-7, alpha held constant)
from ..common.assign import (
    cached,
    gather_classes,
    grid_key,
    points_in_boxes,
    prior_grid,
    resolve_conflicts,
    sanitize_targets,
    topk_mask,
)

ASSIGN_EPS = 1e-9    # eps of the original TaskAlignedAssigner
DFL_MARGIN = 0.01    # DFL targets are clamped to reg_max - 1 - 0.01 (original bbox2dist)


def bbox_to_dist(anchor_points: Tensor, boxes: Tensor, reg_max: int) -> Tensor:
    """xyxy boxes -> ltrb distances from the anchor centres, clamped to ``[0, reg_max-1-0.01]``.

    The upper clamp keeps the right DFL bin (``floor(t) + 1``) inside the ``reg_max`` bins.
    """
    x1y1, x2y2 = boxes.split(2, -1)
    return torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1).clamp(0, reg_max - 1 - DFL_MARGIN)


def distribution_focal_loss(logits: Tensor, target: Tensor) -> Tensor:
    """DFL: cross-entropy on the two bins around a continuous target, linearly weighted.

    ``logits`` (..., reg_max), ``target`` (...) in ``[0, reg_max - 1)``; returns (...).
    For t = 3.3 this is ``0.7 * CE(bin 3) + 0.3 * CE(bin 4)``.
    """
    reg_max = logits.shape[-1]
    logp = logits.log_softmax(-1)
    left = target.long().clamp(0, reg_max - 2)   # target >= 0, so .long() is floor
    right = left + 1
    w_left = right.to(target.dtype) - target
    w_right = 1 - w_left
    nll_left = -logp.gather(-1, left.unsqueeze(-1)).squeeze(-1)
    nll_right = -logp.gather(-1, right.unsqueeze(-1)).squeeze(-1)
    return nll_left * w_left + nll_right * w_right


class TaskAlignedAssigner(nn.Module):
    """Task-aligned label assignment (TOOD / YOLOv9), fixed-shape and sync-free.

    For each gt: metric = score(gt class)^alpha * CIoU(gt, pred)^beta over the anchors whose
    centres lie strictly inside the gt box; the top-k anchors by metric are candidates. An anchor
    claimed by several gts goes to the gt with the highest CIoU (the original's rule: the argmax
    runs over all real gts, so the winner need not be one of the claimants). Soft targets are the
    one-hot class times the metric normalised per gt so that its best anchor gets the gt's best
    CIoU.
    """

    def __init__(self, nc: int, topk: int = 10, alpha: float = 0.5, beta: float = 6.0,
                 eps: float = ASSIGN_EPS, iou: Callable[[Tensor, Tensor], Tensor] = bbox_ciou):
        super().__init__()
        self.nc, self.topk, self.alpha, self.beta, self.eps = nc, topk, alpha, beta, eps
        self.iou = iou   # the overlap of the metric and of the conflict rule (YOLOv9: CIoU; PP-YOLOE: IoU)

    @torch.no_grad()
    def forward(self, pd_scores: Tensor, pd_bboxes: Tensor, anchor_points: Tensor,
                gt_labels: Tensor, gt_bboxes: Tensor, mask_gt: Tensor
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Assign targets.

        Args: ``pd_scores`` (B, N, nc) probabilities, ``pd_bboxes`` (B, N, 4) xyxy,
        ``anchor_points`` (N, 2) in the same units as the boxes, ``gt_labels`` (B, M),
        ``gt_bboxes`` (B, M, 4) xyxy, ``mask_gt`` (B, M) bool (True for real rows).
        Returns ``target_labels`` (B, N) long, ``target_bboxes`` (B, N, 4),
        ``target_scores`` (B, N, nc) and ``fg_mask`` (B, N) bool.
        """
        b, n, nc = pd_scores.shape
        dtype = pd_scores.dtype
        valid, labels, boxes = sanitize_targets(gt_labels, gt_bboxes, mask_gt, nc, dtype)   # (B, M), (B, M, 4)

        # Alignment metric for every (gt, anchor) pair.
        scores = gather_classes(pd_scores, labels)                                     # (B, M, N)
        overlaps = self.iou(boxes.unsqueeze(2), pd_bboxes.unsqueeze(1)).clamp_min(0)   # (B, M, N)
        align = scores.pow(self.alpha) * overlaps.pow(self.beta)

        # Anchor centres strictly inside the gt box.
        in_gts = points_in_boxes(anchor_points, boxes.unsqueeze(2), self.eps).to(dtype)  # (B, M, N)

        # Top-k candidates per gt (k fixed by the shapes), restricted to in-box anchors and real gts.
        in_topk = topk_mask(align * in_gts, self.topk)
        mask_pos = in_topk * in_gts * valid.unsqueeze(-1).to(dtype)

        # An anchor claimed by several gts goes to the gt with the highest CIoU. As in the
        # original, the argmax runs over all (real) gts, not only the claimants.
        best = torch.where(valid.unsqueeze(-1), overlaps, -1.0).argmax(1, keepdim=True)  # (B, 1, N)
        mask_pos = resolve_conflicts(mask_pos, best)
        fg_mask = mask_pos.sum(1) > 0                                                    # (B, N)
        gt_idx = mask_pos.argmax(1)                                                      # (B, N)

        target_labels = labels.gather(1, gt_idx)
        target_bboxes = boxes.gather(1, gt_idx.unsqueeze(-1).expand(b, n, 4))
        classes = torch.arange(nc, device=target_labels.device)
        target_scores = (target_labels.unsqueeze(-1) == classes).to(dtype) * fg_mask.unsqueeze(-1).to(dtype)

        # Normalise: per gt, scale the metric so that its best anchor gets the gt's best CIoU.
        align = align * mask_pos
        pos_align = align.amax(-1, keepdim=True)                                        # (B, M, 1)
        pos_overlaps = (overlaps * mask_pos).amax(-1, keepdim=True)                      # (B, M, 1)
        norm = (align * pos_overlaps / (pos_align + self.eps)).amax(1)                   # (B, N)
        target_scores = target_scores * norm.unsqueeze(-1)
        return target_labels, target_bboxes, target_scores, fg_mask


class Yolo9Loss(nn.Module):
    """The YOLOv9 TAL loss on raw head maps; CUDA-graph capturable.

    ``forward(maps, targets, mask)`` takes the train-mode head maps (B, 4*reg_max + nc, H, W) per
    stride, padded targets (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels and their (B, M)
    validity mask; it returns ``(loss, items)``: ``loss = (box + cls + dfl) * B`` with the gains
    applied (the original's scaling) and detached ``items = [box, cls, dfl]``. The loss is
    always computed in float32 with autocast off.
    """

    #: what ``items`` holds, in order (the trainer's progress bar, results.csv columns)
    item_names = ("box", "cls", "dfl")
    #: distributed runs: each rank computes its share (global score sum, global batch factor);
    #: the ranks' gradients are summed (libreyolo.distributed)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, reg_max: int = 16, strides: Sequence[int] = (8, 16, 32),
                 topk: int = 10, alpha: float = 0.5, beta: float = 6.0,
                 box_gain: float = 7.5, cls_gain: float = 0.5, dfl_gain: float = 1.5):
        super().__init__()
        self.nc, self.reg_max, self.strides = nc, reg_max, tuple(int(s) for s in strides)
        self.box_gain, self.cls_gain, self.dfl_gain = box_gain, cls_gain, dfl_gain
        self.assigner = TaskAlignedAssigner(nc, topk=topk, alpha=alpha, beta=beta)
        self._grid_cache: dict = {}

    # -- anchors ---------------------------------------------------------------------------
    def prepare(self, maps_shapes: Iterable[Sequence[int]], device: torch.device | str,
                dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
        """Build (or fetch) the cached anchors for these map shapes; call before CUDA capture.

        ``maps_shapes``: one shape per stride whose last two entries are (H, W). The loss computes
        in float32, so half/bfloat16 requests are served by the float32 entry it will look up.
        Returns ``(anchor_points (N, 2) in grid units, strides (N, 1), dfl bins (reg_max,))``.
        """
        key = grid_key(maps_shapes, len(self.strides), device, dtype)
        hw, dtype, device = key

        def build():
            points, strides = prior_grid(hw, self.strides, 0.5, False, dtype, device)
            return points, strides, torch.arange(self.reg_max, dtype=dtype, device=device)
        return cached(self._grid_cache, key, build)

    # -- loss ------------------------------------------------------------------------------
    def forward(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Loss for one batch; see the class docstring for shapes and scaling."""
        device_type = maps[0].device.type
        with torch.autocast(device_type=device_type, enabled=False):
            return self._compute([m.float() for m in maps], targets.float(), mask.bool())

    def _compute(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        b, r, nc = maps[0].shape[0], self.reg_max, self.nc
        if maps[0].shape[1] != 4 * r + nc:
            raise ValueError(f"head maps have {maps[0].shape[1]} channels, expected 4*{r}+{nc}")
        anchors, strides, bins = self.prepare([m.shape for m in maps], maps[0].device)
        if targets.shape[1] == 0:   # shape-level (static) decision: keep one all-padding row
            targets = targets.new_zeros(b, 1, 5)
            mask = mask.new_zeros(b, 1)

        flat = torch.cat([m.flatten(2) for m in maps], 2)                      # (B, C, N)
        n = flat.shape[-1]
        dist_logits, cls_logits = flat.split((4 * r, nc), 1)
        dist_logits = dist_logits.transpose(1, 2).reshape(b, n, 4, r)           # (B, N, 4, R)
        cls_logits = cls_logits.transpose(1, 2)                                 # (B, N, nc)
        pred_dist = (dist_logits.softmax(-1) * bins).sum(-1)                    # (B, N, 4) grid units
        lt, rb = pred_dist.split(2, -1)
        pred_boxes = torch.cat((anchors - lt, anchors + rb), -1)                # (B, N, 4) grid units

        _, target_boxes, target_scores, fg = self.assigner(
            cls_logits.detach().sigmoid(), pred_boxes.detach() * strides, anchors * strides,
            targets[..., 0], targets[..., 1:5], mask)
        target_boxes = target_boxes / strides
        score_sum = global_sum(target_scores.sum()).clamp_min(1.0)

        loss_cls = F.binary_cross_entropy_with_logits(cls_logits, target_scores, reduction="none").sum() / score_sum

        weight = target_scores.sum(-1) * fg.to(target_scores.dtype)           # (B, N), 0 off foreground
        ciou = bbox_ciou(pred_boxes, target_boxes)
        loss_box = ((1.0 - ciou) * weight).sum() / score_sum
        target_ltrb = bbox_to_dist(anchors, target_boxes, r)
        dfl = distribution_focal_loss(dist_logits, target_ltrb).mean(-1)      # (B, N)
        loss_dfl = (dfl * weight).sum() / score_sum

        items = torch.stack((loss_box * self.box_gain, loss_cls * self.cls_gain, loss_dfl * self.dfl_gain))
        return items.sum() * global_batch(b), items.detach()
