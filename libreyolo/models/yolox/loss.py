"""YOLOX training loss (SimOTA assignment; IoU, objectness, class and late L1 terms), fixed-shape.

The loss of Megvii's YOLOX (``yolox/models/yolo_head.py``, release 0.3.0), rewritten so that
it can be captured in a CUDA graph: each tensor's shape follows from the input shapes, and
nothing reads a tensor value on the host (no scalar read-backs, boolean-mask indexing,
per-gt Python loops or data-dependent branches). Targets come padded to a fixed ``M`` with a
validity mask. Where the original gathers the candidate anchors of one image and loops over
its gts, this works on the full (B, M, N) gt x anchor grid and masks:

* candidates: the anchors whose centre lies within ``center_radius`` = 1.5 strides of some
  gt's centre (0.3.0). ``box_prior=True, center_radius=2.5`` gives the earlier releases' rule
  instead: inside some gt's box or within 2.5 strides of its centre, with the "outside" cost
  off the box-and-centre region.
* cost = class BCE of sqrt(sigmoid(cls) * sigmoid(obj)) against the gt's one-hot
  + 3 * -log(IoU + 1e-8) + a large constant off the gt's own region; non-candidates never match.
* dynamic k = max(1, floor(sum of the gt's 10 best candidate IoUs)); the k cheapest candidates
  are taken with a ``topk`` over a fixed 10 and a ``rank < k`` mask; an anchor claimed by
  several gts goes to the cheapest gt.

Terms, each divided by the number of foreground anchors in the batch (at least 1):
``5 * sum(1 - IoU^2)`` (the original "iou" IOUloss), objectness BCE over all anchors, class
BCE on foreground anchors against one-hot x the assignment IoU, and, only when ``use_l1`` is
on (the original switches it on with mosaic off for the final 15 epochs), L1 between the raw
box outputs and the encoded gt. The total is not multiplied by the batch size, as in YOLOX.

The SimOTA core (:func:`~libreyolo.models.common.assign.pairwise_class_cost` and
:func:`~libreyolo.models.common.assign.dynamic_k_matching`) lives in ``models/common/assign.py``,
shared with YOLOv7's OTA loss and the RTMDet and PicoDet assigners.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_sum
from ...ops.iou import bbox_iou
from ..common.assign import (
    cached,
    dynamic_k_matching,
    grid_key,
    pairwise_class_cost,
    points_in_boxes,
    points_near_centres,
    prior_grid,
)

IOU_COST_EPS = 1e-8    # -log(IoU + eps) in the cost
IOU_LOSS_EPS = 1e-16   # IOUloss: inter / (union + eps)
L1_EPS = 1e-8          # log(w / stride + eps) in the L1 target


class SimOTAAssigner(nn.Module):
    """YOLOX's SimOTA label assignment over all anchors of a batch (see the module docstring)."""

    def __init__(self, nc: int, center_radius: float = 1.5, box_prior: bool = False, topk: int = 10,
                 iou_weight: float = 3.0, outside_cost: float | None = None):
        super().__init__()
        self.nc, self.center_radius, self.box_prior = nc, center_radius, box_prior
        self.topk, self.iou_weight = topk, iou_weight
        # the constants of the two releases (1e5 with the box prior, 1e6 after)
        self.outside_cost = outside_cost if outside_cost is not None else (1e5 if box_prior else 1e6)

    @torch.no_grad()
    def forward(self, cls_logits: Tensor, obj_logits: Tensor, pred_boxes: Tensor, centers: Tensor,
                strides: Tensor, gt_labels: Tensor, gt_boxes: Tensor, mask_gt: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Assign targets.

        Args: ``cls_logits`` (B, N, nc), ``obj_logits`` (B, N), ``pred_boxes`` (B, N, 4) xyxy
        pixels, ``centers`` (N, 2) anchor-cell centres in pixels, ``strides`` (N,),
        ``gt_labels`` (B, M) long, ``gt_boxes`` (B, M, 4) xyxy pixels (padded rows already
        harmless), ``mask_gt`` (B, M) bool. Returns ``fg`` (B, N) bool, ``gt_idx`` (B, N) long
        and ``matched_iou`` (B, N), the IoU of each foreground anchor's box with its gt.
        """
        radius = self.center_radius * strides.unsqueeze(-1)                  # (N, 1)
        in_center = points_near_centres(centers, gt_boxes, radius)            # (B, M, N)
        if self.box_prior:
            # the box's edges as the original rebuilds them, centre -/+ half the size
            xy1, xy2 = gt_boxes[..., :2], gt_boxes[..., 2:]
            centre, half = (xy1 + xy2) / 2, 0.5 * (xy2 - xy1)
            in_box = points_in_boxes(centers, torch.cat((centre - half, centre + half), -1).unsqueeze(-2))
            region, own = in_box | in_center, in_box & in_center
        else:
            region, own = in_center, in_center
        candidate = (region & mask_gt.unsqueeze(-1)).any(1)                   # (B, N)

        ious = bbox_iou(gt_boxes.unsqueeze(2), pred_boxes.unsqueeze(1), eps=IOU_LOSS_EPS)
        probs = (cls_logits.sigmoid() * obj_logits.sigmoid().unsqueeze(-1)).sqrt()
        cost = (pairwise_class_cost(probs, gt_labels)
                - self.iou_weight * torch.log(ious + IOU_COST_EPS)
                + self.outside_cost * (~own).to(ious.dtype))
        matching, fg, gt_idx = dynamic_k_matching(cost, ious, candidate, mask_gt, self.topk)
        return fg, gt_idx, (matching * ious).sum(1)


class YoloxLoss(nn.Module):
    """The YOLOX loss on the train-mode head maps; CUDA-graph capturable.

    ``forward(maps, targets, mask)``: ``maps`` the per-stride (B, 5 + nc, H, W) logit maps of
    ``YoloxNet`` in train mode (tx, ty, tw, th, objectness, classes), ``targets`` (B, M, 5)
    ``[cls, x1, y1, x2, y2]`` in input pixels, ``mask`` (B, M) bool. Returns
    ``(loss, items)`` with ``loss = 5 * iou + obj + cls + l1`` (YOLOX's total, not scaled by
    the batch size) and detached ``items`` in the order of :attr:`item_names` (the iou item
    carries the 5x weight, as YOLOX logs it). Computed in float32 with autocast off.
    """

    item_names: tuple[str, ...] = ("iou", "obj", "cls", "l1")
    #: distributed runs: each rank divides by the global foreground count (its share of the
    #: loss); the ranks' gradients are summed (libreyolo.distributed)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, strides: Sequence[int] = (8, 16, 32), reg_weight: float = 5.0,
                 l1_epochs: int = 15, use_l1: bool = False, center_radius: float = 1.5,
                 box_prior: bool = False, topk: int = 10):
        super().__init__()
        self.nc, self.strides = int(nc), tuple(int(s) for s in strides)
        self.reg_weight, self.l1_epochs, self.use_l1 = reg_weight, int(l1_epochs), bool(use_l1)
        self.assigner = SimOTAAssigner(nc, center_radius=center_radius, box_prior=box_prior, topk=topk)
        self._grid_cache: dict = {}

    def on_epoch(self, epoch: int, epochs: int) -> bool:
        """Turn the L1 term on for the last ``l1_epochs`` epochs (0-based ``epoch``).

        Returns True when that changes what the loss computes (captured graphs are stale).
        YOLOX's own loop switches one epoch earlier (at ``epoch + 1 == max_epoch - 15``, so for
        16 epochs); this uses exactly the last ``l1_epochs``.
        """
        want = self.l1_epochs > 0 and epoch >= epochs - self.l1_epochs
        changed = want != self.use_l1
        self.use_l1 = want
        return changed

    def prepare(self, maps_shapes: Iterable[Sequence[int]], device: torch.device | str,
                dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """Cached ``(cells (N, 2) as (col, row), strides (N, 1))`` for these map shapes.

        Call before CUDA capture. Half and bfloat16 requests get the float32 entry (the loss
        computes in float32).
        """
        key = grid_key(maps_shapes, len(self.strides), device, dtype)
        return cached(self._grid_cache, key, lambda: prior_grid(key[0], self.strides, 0.0, False, *key[1:]))

    def forward(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Loss for one batch; see the class docstring for shapes and scaling."""
        with torch.autocast(device_type=maps[0].device.type, enabled=False):
            return self._compute([m.float() for m in maps], targets.float(), mask.bool())

    def _compute(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        b, nc = maps[0].shape[0], self.nc
        if maps[0].shape[1] != 5 + nc:
            raise ValueError(f"head maps have {maps[0].shape[1]} channels, expected 5+{nc}")
        cells, strides = self.prepare([m.shape for m in maps], maps[0].device)
        if targets.shape[1] == 0:   # shape-level (static) decision: keep one all-padding row
            targets, mask = targets.new_zeros(b, 1, 5), mask.new_zeros(b, 1)

        flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)     # (B, N, 5 + nc)
        raw_box, obj_logits, cls_logits = flat[..., :4], flat[..., 4], flat[..., 5:]
        centre = (raw_box[..., :2] + cells) * strides
        half = raw_box[..., 2:4].exp() * strides / 2
        pred_boxes = torch.cat((centre - half, centre + half), -1)            # (B, N, 4) pixels

        # Padded rows are zeroed (whatever they hold) and masked out of the assignment.
        labels = torch.where(mask, targets[..., 0], 0).long().clamp(0, nc - 1)
        gt_boxes = torch.where(mask.unsqueeze(-1), targets[..., 1:5], 0)
        fg, gt_idx, matched_iou = self.assigner(
            cls_logits.detach(), obj_logits.detach(), pred_boxes.detach(), (cells + 0.5) * strides,
            strides.squeeze(-1), labels, gt_boxes, mask)
        weight = fg.to(flat.dtype)                                            # (B, N)
        num_fg = global_sum(weight.sum()).clamp_min(1.0)

        target_boxes = gt_boxes.gather(1, gt_idx.unsqueeze(-1).expand(-1, -1, 4))
        iou = bbox_iou(pred_boxes, target_boxes, eps=IOU_LOSS_EPS)
        loss_iou = ((1.0 - iou.square()) * weight).sum() / num_fg
        loss_obj = F.binary_cross_entropy_with_logits(obj_logits, weight, reduction="sum") / num_fg
        target_cls = F.one_hot(labels.gather(1, gt_idx), nc).to(flat.dtype) * matched_iou.unsqueeze(-1)
        bce_cls = F.binary_cross_entropy_with_logits(cls_logits, target_cls, reduction="none").sum(-1)
        loss_cls = (bce_cls * weight).sum() / num_fg
        if self.use_l1:   # a Python flag: flipping it changes the graph (on_epoch says so)
            tx1, ty1, tx2, ty2 = target_boxes.unbind(-1)
            s = strides.squeeze(-1)
            l1_target = torch.stack(((tx1 + tx2) / 2 / s - cells[:, 0], (ty1 + ty2) / 2 / s - cells[:, 1],
                                     torch.log(((tx2 - tx1) / s).clamp_min(0) + L1_EPS),
                                     torch.log(((ty2 - ty1) / s).clamp_min(0) + L1_EPS)), -1)
            loss_l1 = ((raw_box - l1_target).abs().sum(-1) * weight).sum() / num_fg
        else:
            loss_l1 = torch.zeros((), dtype=flat.dtype, device=flat.device)

        items = torch.stack((self.reg_weight * loss_iou, loss_obj, loss_cls, loss_l1))
        return items.sum(), items.detach()
