"""YOLOv7 training loss (OTA assignment; CIoU box, IoU-target objectness and class BCE), fixed-shape.

The loss of WongKinYiu/yolov7 ``ComputeLossOTA`` (``utils/loss.py``), the one its P5 and tiny
recipes train with. Our YOLOv7 networks have no auxiliary heads (``Detect`` in ``nn.py`` has
one implicit head per level), so this is the plain variant, not ``ComputeLossAuxOTA``.

Rewritten so that it can be captured in a CUDA graph: each tensor's shape follows from the
input shapes and nothing reads a tensor value on the host. Targets come padded to a fixed
``M`` with a validity mask. Where the original filters candidate lists and loops over images
and gts, this enumerates a fixed set of candidate *columns* per gt and masks:

* columns: for every gt, level (3), anchor (3) and cell option (5): the cell holding the gt
  centre and the four neighbours of the original's 3-cell rule (left if the centre's x
  fraction is < 0.5 and x > 1, up likewise, right / down mirrored from the far edge; up to
  three are live, or five when the centre lies exactly on cell edges, as in the original).
  A column is live when the gt is real, its wh ratio to the anchor is within ``anchor_t`` = 4
  on both sides, and the option applies. ``K = 45 M`` columns per image.
* SimOTA over an image's columns (shared with YOLOX, ``models/common/assign.py``): cost = class
  BCE of sqrt(sigmoid(cls) * sigmoid(obj)) (logs clamped at -100, which only matters for
  saturated scores) + 3 * -log(IoU + 1e-8), no geometry term; any gt
  of the image may take any live column (as in the original, also one proposed by another
  gt); dynamic k from the 10 best IoUs; a column taken twice goes to its cheapest gt. Two
  columns at the same prediction (proposed by two gts) both count, as in the original. Such
  twins cost the same, and which of them a gt takes is up to ``topk``'s order among ties,
  which is implementation-defined here as in the original (its CPU and GPU runs can differ
  too); outside such ties the assignment is the original's.

Loss, per level: box = mean over matched columns of 1 - CIoU (grid units, relative to the
cell), class = BCE mean over matched columns x classes (only when nc > 1), objectness = BCE
mean over all predictions against ``(1 - gr) + gr * CIoU.clamp(0)`` at matched predictions
(gr = 1), weighted by the level balance [4.0, 1.0, 0.4]. One deliberate difference: where two
matched columns share a prediction, its objectness target is the larger of their values; the
original writes both and keeps whichever lands last (undefined on CUDA). Gains are those of the
hyp files scaled as in yolov7's ``train.py``: box * 3/nl, obj * (imgsz/640)^2 * 3/nl,
cls * nc/80 * 3/nl. ``loss = (box + obj + cls) * batch_size``, as in the original.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_batch, global_sum, share_of_mean
from ...ops.iou import bbox_ciou, bbox_iou, cxcywh_to_xyxy, xyxy_to_cxcywh
from ..common.assign import dynamic_k_matching, pairwise_class_cost
from .nn import ANCHORS, STRIDES

IOU_COST_EPS = 1e-8    # -log(IoU + eps) in the cost, as in YOLOX's SimOTA

#: the hyp-file gains per size (data/hyp.scratch.p5.yaml, data/hyp.scratch.tiny.yaml)
HYPERPARAMETERS: dict[str, dict[str, float]] = {
    "b": {"box": 0.05, "obj": 0.7, "cls": 0.3},
    "tiny": {"box": 0.05, "obj": 1.0, "cls": 0.5},
}
#: cell options: the centre's cell, then the neighbours left, up, right, down. Each offset is
#: subtracted from the centre (grid units) before truncation, as in yolov7's find_3_positive.
CELL_OFFSETS = ((0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (-0.5, 0.0), (0.0, -0.5))
NEIGHBOUR_BIAS = 0.5


class Yolo7Loss(nn.Module):
    """The YOLOv7 OTA loss on the raw head maps; CUDA-graph capturable.

    ``forward(maps, targets, mask)``: ``maps`` the per-stride (B, na*(5 + nc), H, W) raw maps of
    ``Yolo7Net`` (anchor-major channels), ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in
    input pixels, ``mask`` (B, M) bool. Returns ``(loss, items)``: ``loss`` the gained sum
    times the batch size, detached ``items = [box, obj, cls]`` with gains applied. Computed in
    float32 with autocast off. ``imgsz`` is the nominal training size the obj gain scales with.
    """

    item_names: tuple[str, ...] = ("box", "obj", "cls")
    #: distributed runs: each rank computes its share (global matched counts, its part of the
    #: objectness mean, the global batch factor); the ranks' gradients are summed
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, anchors: Sequence = ANCHORS, strides: Sequence[int] = STRIDES,
                 imgsz: int = 640, box: float = 0.05, obj: float = 0.7, cls: float = 0.3,
                 anchor_t: float = 4.0, balance: Sequence[float] = (4.0, 1.0, 0.4), gr: float = 1.0,
                 topk: int = 10, iou_weight: float = 3.0):
        super().__init__()
        self.nc, self.strides = int(nc), tuple(int(s) for s in strides)
        nl = len(self.strides)
        if len(anchors) != nl or len(balance) != nl:
            raise ValueError(f"{nl} strides need {nl} anchor sets and {nl} balance weights")
        self.box_gain = box * 3.0 / nl
        self.obj_gain = obj * (imgsz / 640) ** 2 * 3.0 / nl
        self.cls_gain = cls * self.nc / 80.0 * 3.0 / nl
        self.anchor_t, self.balance, self.gr = anchor_t, tuple(float(b) for b in balance), gr
        self.topk, self.iou_weight = topk, iou_weight
        # constants as buffers: nothing is copied from the host inside a captured forward
        anchors_px = torch.tensor(anchors, dtype=torch.float32)              # (nl, na, 2) pixels
        stride_t = torch.tensor(self.strides, dtype=torch.float32)
        self.register_buffer("anchors", anchors_px, persistent=False)
        self.register_buffer("anchor_grid", anchors_px / stride_t.view(-1, 1, 1), persistent=False)
        self.register_buffer("stride_t", stride_t, persistent=False)
        self.register_buffer("offsets", torch.tensor(CELL_OFFSETS, dtype=torch.float32), persistent=False)

    @property
    def na(self) -> int:
        return int(self.anchors.shape[1])

    def forward(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Loss for one batch; see the class docstring for shapes and scaling."""
        if self.anchors.device != maps[0].device:   # first call only; constants follow the maps
            self.to(maps[0].device)
        with torch.autocast(device_type=maps[0].device.type, enabled=False):
            return self._compute([m.float() for m in maps], targets.float(), mask.bool())

    # -- candidate columns -------------------------------------------------------------------
    def _columns(self, gt_cxcywh: Tensor, mask: Tensor, hw: list[tuple[int, int]]
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Every gt's columns, flattened to K = nl * 5 * na * M in the order of the original's
        candidate list (level, cell option, anchor, gt).

        Returns ``loc`` (B, K) long index into the concatenated predictions, ``live`` (B, K) bool,
        ``cell`` (B, K, 2) the column's (col, row), ``anchor`` (K, 2) its anchor in grid units,
        ``level`` (K,) its level.
        """
        b, m = mask.shape
        nl, na, no = len(hw), self.na, len(CELL_OFFSETS)
        device = gt_cxcywh.device
        locs, lives, cols, rows = [], [], [], []
        start = 0
        for lvl, ((h, w), s) in enumerate(zip(hw, self.strides)):
            g = gt_cxcywh / s                                                 # (B, M, 4) grid units
            gxy, gwh = g[..., :2], g[..., 2:]
            ratio = gwh.unsqueeze(2) / self.anchor_grid[lvl]                  # (B, M, na, 2)
            fits = torch.maximum(ratio, 1.0 / ratio).amax(-1) < self.anchor_t  # (B, M, na)
            far = torch.stack((w - gxy[..., 0], h - gxy[..., 1]), -1)
            near_ok = (gxy % 1.0 < NEIGHBOUR_BIAS) & (gxy > 1.0)              # (B, M, 2): left, up
            far_ok = (far % 1.0 < NEIGHBOUR_BIAS) & (far > 1.0)               # right, down
            option_ok = torch.cat((torch.ones_like(near_ok[..., :1]), near_ok, far_ok), -1)  # (B, M, 5)
            cell = (gxy.unsqueeze(2) - self.offsets).long()                   # (B, M, 5, 2), truncated
            col = cell[..., 0].clamp(0, w - 1).unsqueeze(2)                   # (B, M, 1, 5)
            row = cell[..., 1].clamp(0, h - 1).unsqueeze(2)
            a = torch.arange(na, device=device).view(1, 1, na, 1)
            # (B, M, na, 5) -> (B, 5, na, M): the original's column order (option, anchor, gt)
            locs.append((start + (a * h + row) * w + col).permute(0, 3, 2, 1))
            live = fits.unsqueeze(-1) & option_ok.unsqueeze(2) & mask.view(b, m, 1, 1)
            lives.append(live.permute(0, 3, 2, 1))
            cols.append(col.expand(b, m, na, no).permute(0, 3, 2, 1))
            rows.append(row.expand(b, m, na, no).permute(0, 3, 2, 1))
            start += na * h * w
        loc = torch.stack(locs, 1).reshape(b, -1)                             # (B, nl*5*na*M)
        live = torch.stack(lives, 1).reshape(b, -1)
        cell = torch.stack((torch.stack(cols, 1), torch.stack(rows, 1)), -1).reshape(b, -1, 2)
        cell = cell.to(gt_cxcywh.dtype)
        anchor = self.anchor_grid.view(nl, 1, na, 1, 2).expand(nl, no, na, m, 2).reshape(-1, 2)
        level = torch.arange(nl, device=device).view(nl, 1, 1, 1).expand(nl, no, na, m).reshape(-1)
        return loc, live, cell, anchor, level

    # -- loss ------------------------------------------------------------------------------
    def _compute(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        b, nc, na = maps[0].shape[0], self.nc, self.na
        if len(maps) != len(self.strides):
            raise ValueError(f"expected {len(self.strides)} feature maps, got {len(maps)}")
        if maps[0].shape[1] != na * (5 + nc):
            raise ValueError(f"head maps have {maps[0].shape[1]} channels, expected {na}*(5+{nc})")
        if targets.shape[1] == 0:   # shape-level (static) decision: keep one all-padding row
            targets, mask = targets.new_zeros(b, 1, 5), mask.new_zeros(b, 1)
        hw = [(int(p.shape[-2]), int(p.shape[-1])) for p in maps]
        flat = torch.cat([p.view(b, na, 5 + nc, h, w).permute(0, 1, 3, 4, 2).reshape(b, na * h * w, 5 + nc)
                          for p, (h, w) in zip(maps, hw)], 1)                  # (B, N, 5 + nc)

        labels = torch.where(mask, targets[..., 0], 0).long().clamp(0, nc - 1)
        gt_boxes = torch.where(mask.unsqueeze(-1), targets[..., 1:5], 0)      # (B, M, 4) xyxy pixels
        gt_cxcywh = xyxy_to_cxcywh(gt_boxes)
        loc, live, cell, anchor, level = self._columns(gt_cxcywh, mask, hw)
        stride = self.stride_t[level]                                         # (K,)

        # predictions at the columns, decoded in grid units relative to the column's cell
        pred = flat.gather(1, loc.unsqueeze(-1).expand(-1, -1, 5 + nc))       # (B, K, 5 + nc)
        pxy = pred[..., :2].sigmoid() * 2.0 - 0.5
        pwh = (pred[..., 2:4].sigmoid() * 2.0).square() * anchor
        pbox = torch.cat((pxy, pwh), -1)

        with torch.no_grad():   # the OTA assignment
            s = stride.unsqueeze(-1)
            pix = cxcywh_to_xyxy(torch.cat(((pxy + cell) * s, pwh * s), -1))   # (B, K, 4) pixels
            ious = bbox_iou(gt_boxes.unsqueeze(2), pix.unsqueeze(1))           # (B, M, K)
            probs = (pred[..., 5:].sigmoid() * pred[..., 4:5].sigmoid()).sqrt()
            cost = pairwise_class_cost(probs, labels) - self.iou_weight * torch.log(ious + IOU_COST_EPS)
            _, fg, gt_idx = dynamic_k_matching(cost, ious, live, mask, self.topk)

        weight = fg.to(flat.dtype)                                            # (B, K)
        target = gt_cxcywh.gather(1, gt_idx.unsqueeze(-1).expand(-1, -1, 4))   # (B, K, 4) pixels
        tbox = torch.cat((target[..., :2] / stride.unsqueeze(-1) - cell, target[..., 2:] / stride.unsqueeze(-1)), -1)
        ciou = bbox_ciou(cxcywh_to_xyxy(pbox), cxcywh_to_xyxy(tbox))            # (B, K)

        nl = len(hw)
        per_level = F.one_hot(level, nl).to(flat.dtype)                       # (K, nl)
        count = global_sum(weight.sum(0) @ per_level).clamp_min(1.0)          # (nl,)
        loss_box = ((((1.0 - ciou) * weight).sum(0) @ per_level) / count).sum()
        if nc > 1:
            onehot = F.one_hot(labels.gather(1, gt_idx), nc).to(flat.dtype)
            bce = F.binary_cross_entropy_with_logits(pred[..., 5:], onehot, reduction="none").sum(-1)
            loss_cls = (((bce * weight).sum(0) @ per_level) / (count * nc)).sum()
        else:
            loss_cls = torch.zeros((), dtype=flat.dtype, device=flat.device)

        tobj_value = torch.where(fg, (1.0 - self.gr) + self.gr * ciou.detach().clamp_min(0), 0)
        tobj = torch.zeros_like(flat[..., 4]).scatter_reduce(1, loc, tobj_value, "amax", include_self=True)
        bce_obj = F.binary_cross_entropy_with_logits(flat[..., 4], tobj, reduction="none")   # (B, N)
        loss_obj = flat.new_zeros(())
        start = 0
        for lvl, (h, w) in enumerate(hw):
            n = na * h * w
            loss_obj = loss_obj + self.balance[lvl] * share_of_mean(bce_obj[:, start:start + n].mean(), b)
            start += n

        items = torch.stack((loss_box * self.box_gain, loss_obj * self.obj_gain, loss_cls * self.cls_gain))
        return items.sum() * global_batch(b), items.detach()
