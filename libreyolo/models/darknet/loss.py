"""The classic YOLO losses of Darknet's ``[region]`` (YOLOv2) and ``[yolo]`` (YOLOv3, YOLOv4) layers.

What Darknet computes, per ground truth and per prediction:

* **assignment**: each ground truth takes the anchor (of all the cfg's anchors) whose shape best
  overlaps its own (IoU of the two boxes centred together; the first on a tie), at the cell
  holding its centre on that anchor's head; a ground truth whose best anchor belongs to no head
  (YOLOv4-tiny leaves anchor 0 out) is assigned nowhere. YOLOv4 (``iou_thresh`` 0.213) also
  assigns every other anchor whose shape IoU exceeds it. When several ground truths land on one
  prediction, the last of them (in target order) sets its box target, as Darknet's loop
  overwrites; the class targets are their union ([yolo]) or the last one's class ([region]);
* **box**: ``"coord"`` (v2, v3): the cell offsets against sigmoid(tx), sigmoid(ty) as binary
  cross-entropies (Darknet's delta ``t - sigmoid(x)`` is their gradient; the target's entropy is
  subtracted so a perfect prediction costs 0) and the log sizes ``log(w / anchor_w)`` against tw,
  th as half squared errors, all scaled by ``2 - w * h`` (box area over image area); ``"ciou"``
  (v4): 1 - CIoU of the decoded box (with ``scale_x_y``) and the ground truth;
* **objectness**: binary cross-entropy; target 1 at assigned predictions ([region] with
  ``rescore``: the IoU of the predicted box with its ground truth, weighted ``object_scale`` = 5),
  0 elsewhere, except that a prediction whose decoded box overlaps a ground truth by more than
  ``ignore_thresh`` (v3, v4: 0.7; v2: 0.6) gets no no-object loss (``noobject_scale`` = 1);
* **class**: binary cross-entropy per class ([yolo]) or the softmax cross-entropy ([region]).

Darknet sums these terms over every prediction of an image (``box`` weighted by ``box_scale``:
YOLOv4's ``iou_normalizer`` 0.07) and updates the weights by ``learning_rate / batch`` times the
batch's summed gradient, ``learning_rate`` 0.001 in the v2 and v3 cfgs. The library's trainer
steps by ``lr0`` times the gradient summed over a nominal batch of 64 images, ``lr0`` 0.01 for
SGD. The per-image loss here is Darknet's sum divided by 640 = 0.01 x 64 / 0.001, so the
trainer's default step equals Darknet's and every term keeps Darknet's weight relative to the
others. ``items`` are the three sums per image (over 640); ``loss = (box + obj + cls) *
batch_size``.

Fixed shapes and padding: targets come padded to ``M`` rows with a validity mask. Each (gt,
anchor) pair is a column; the columns are scattered into per-prediction maps (the winning
ground truth, the class targets) and every reduction runs over (B, N) prediction maps, whose
shape does not depend on ``M``. Padding columns scatter nothing (their values are exactly 0 and
``amax`` keeps the map's 0), so the loss of padded targets equals the unpadded loss bit for bit.
Nothing reads a tensor value on the host, so the step can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_batch, share_of_mean
from ...ops.iou import bbox_ciou, bbox_iou, cxcywh_to_xyxy, xyxy_to_cxcywh
from .cfgs import DarknetCfg
from .nn import head_tables, join_heads

#: the per-image Darknet sum is divided by this: the trainer's lr0 (0.01) x nominal batch (64)
#: over Darknet's learning_rate (0.001), so that the trainer's default step is Darknet's
DARKNET_STEP_NORMALIZER = 640.0
#: tw, th above this are clamped in the CIoU decode (exp(8) ~ 3000 anchors wide): no overflow
MAX_LOG_SIZE = 8.0
#: sides below this (pixels) are clamped in the log-size targets: no -inf from a degenerate box
MIN_SIDE = 1e-3


class DarknetLoss(nn.Module):
    """The classic YOLO loss of one Darknet cfg; CUDA-graph capturable.

    ``forward(maps, targets, mask)``: ``maps`` the raw head maps of :class:`DarknetDetector` (cfg
    order), ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels, ``mask`` (B, M)
    bool. Returns ``(loss, items)``, ``items = [box, obj, cls]`` detached: Darknet's per-image sums
    (batch mean) over ``normalizer``.
    Computed in float32 with autocast off.
    """

    item_names: tuple[str, ...] = ("box", "obj", "cls")
    DDP_REDUCTION = "sum"

    def __init__(self, heads, cfg: DarknetCfg, nc: int, normalizer: float = DARKNET_STEP_NORMALIZER):
        super().__init__()
        self.heads, self.nc, self.region = tuple(heads), int(nc), cfg.region
        self.normalizer = float(normalizer)
        self.box_scale = float(cfg.box_scale)
        self.ignore_thresh, self.iou_thresh = float(cfg.ignore_thresh), float(cfg.iou_thresh)
        if cfg.box not in ("coord", "ciou"):
            raise ValueError(f"unknown box loss {cfg.box!r}")
        self.box_kind = cfg.box
        self.object_scale, self.noobject_scale, self.rescore = cfg.object_scale, cfg.noobject_scale, cfg.rescore
        # every anchor of the cfg in pixels (the assignment compares a ground truth with all of them)
        if self.region:
            self.anchors_px = tuple(self.heads[0].anchors)
        else:
            self.anchors_px = tuple((float(w), float(h)) for w, h in cfg.anchors)
        self._grid_cache: dict = {}

    def forward(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        with torch.autocast(device_type=maps[0].device.type, enabled=False):
            targets, mask = targets.float(), mask.bool()
            if targets.shape[1] == 0:   # shape-level (static) decision: one all-padding row
                targets, mask = targets.new_zeros(targets.shape[0], 1, 5), mask.new_zeros(mask.shape[0], 1)
            return self._compute([m.float() for m in maps], targets, mask)

    # -- assignment ----------------------------------------------------------------------------
    def _anchor_choice(self, gt_wh: Tensor, mask: Tensor) -> Tensor:
        """(B, M, A) bool: the anchors each real ground truth is assigned (its best-shaped one, and
        with ``iou_thresh`` < 1 every other whose shape IoU exceeds it)."""
        b, m = mask.shape
        a = len(self.anchors_px)
        aw = torch.cat([torch.full((1,), w, dtype=gt_wh.dtype, device=gt_wh.device) for w, _ in self.anchors_px])
        ah = torch.cat([torch.full((1,), h, dtype=gt_wh.dtype, device=gt_wh.device) for _, h in self.anchors_px])
        w, h = gt_wh[..., 0:1], gt_wh[..., 1:2]                                  # (B, M, 1)
        inter = torch.minimum(w, aw) * torch.minimum(h, ah)                      # (B, M, A)
        iou = inter / (w * h + aw * ah - inter)
        choice = F.one_hot(iou.argmax(-1), a).bool()
        if self.iou_thresh < 1.0:
            choice = choice | (iou > self.iou_thresh)
        return choice & mask.unsqueeze(-1)

    def _columns(self, gt_cxcywh: Tensor, choice: Tensor, hw: list[tuple[int, int]]) -> tuple[Tensor, Tensor]:
        """``loc`` (B, M, K) long: the prediction (index into the joined heads) of each (gt, head
        anchor) pair, and ``live`` (B, M, K) bool; K = the anchors of all heads."""
        locs, lives = [], []
        start = 0
        for head, (h, w) in zip(self.heads, hw):
            na = len(head.anchors)
            g = gt_cxcywh[..., :2] / head.stride
            col = g[..., 0].floor().clamp(0, w - 1).long().unsqueeze(-1)         # (B, M, 1)
            row = g[..., 1].floor().clamp(0, h - 1).long().unsqueeze(-1)
            a = torch.arange(na, device=g.device)
            locs.append(start + (a * h + row) * w + col)                         # (B, M, na)
            lives.append(choice[..., head.first_anchor:head.first_anchor + na])
            start += na * h * w
        return torch.cat(locs, -1), torch.cat(lives, -1)

    # -- loss ------------------------------------------------------------------------------------
    def _compute(self, maps: list[Tensor], targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        nc = self.nc
        flat = join_heads(maps, self.heads, nc)                                  # (B, N, 5 + nc)
        b, n = flat.shape[:2]
        hw = [(int(p.shape[-2]), int(p.shape[-1])) for p in maps]
        grid, stride, anchor, scale, offset = head_tables(self.heads, tuple(hw), flat.dtype, flat.device,
                                                          self._grid_cache)
        img_area = float(hw[0][0] * self.heads[0].stride * hw[0][1] * self.heads[0].stride)

        labels = torch.where(mask, targets[..., 0], 0).long().clamp(0, nc - 1)   # (B, M)
        gt_xyxy = torch.where(mask.unsqueeze(-1), targets[..., 1:5], 0)           # padding: the zero box
        gt_cxcywh = xyxy_to_cxcywh(gt_xyxy)

        with torch.no_grad():
            choice = self._anchor_choice(gt_cxcywh[..., 2:], mask)
            loc, live = self._columns(gt_cxcywh, choice, hw)                     # (B, M, K)
            m = mask.shape[1]
            k = loc.shape[-1]
            gt_rank = torch.arange(1, m + 1, device=flat.device, dtype=flat.dtype).view(1, m, 1).expand(b, m, k)
            loc, live, gt_rank = loc.reshape(b, -1), live.reshape(b, -1), gt_rank.reshape(b, -1)
            # the last assigned gt of each prediction (0: none); padding columns scatter 0 = no change
            winner = flat.new_zeros(b, n).scatter_reduce(1, loc, torch.where(live, gt_rank, 0), "amax")
            pos = winner > 0                                                     # (B, N)
            gt_idx = (winner - 1).clamp_min(0).long()
            tbox = gt_cxcywh.gather(1, gt_idx.unsqueeze(-1).expand(b, n, 4))       # (B, N, 4) pixels
            # decoded predictions, for the ignore rule and the [region] IoU target
            pxy = (flat[..., 0:2].sigmoid() * scale - offset + grid) * stride
            pwh = flat[..., 2:4].clamp(max=MAX_LOG_SIZE).exp() * anchor
            pred_xyxy = cxcywh_to_xyxy(torch.cat((pxy, pwh), -1))
            ious = bbox_iou(pred_xyxy.unsqueeze(2), gt_xyxy.unsqueeze(1))         # (B, N, M)
            best = torch.where(mask.unsqueeze(1), ious, 0).amax(-1)
            ignored = (best > self.ignore_thresh) & ~pos

        posf = pos.to(flat.dtype)
        # box
        tbox = torch.where(pos.unsqueeze(-1), tbox, torch.cat((pxy, anchor.expand(b, n, 2)), -1).detach())
        if self.box_kind == "ciou":
            s = flat[..., 0:2].sigmoid() * scale - offset
            box_xywh = torch.cat(((s + grid) * stride, flat[..., 2:4].clamp(max=MAX_LOG_SIZE).exp() * anchor), -1)
            box_term = 1.0 - bbox_ciou(cxcywh_to_xyxy(box_xywh), cxcywh_to_xyxy(tbox))
        else:
            txy = (tbox[..., :2] / stride - grid).clamp(0.0, 1.0)
            twh = torch.log(tbox[..., 2:].clamp_min(MIN_SIDE) / anchor)
            entropy = -(torch.special.xlogy(txy, txy) + torch.special.xlogy(1 - txy, 1 - txy))
            xy_term = F.binary_cross_entropy_with_logits(flat[..., 0:2], txy, reduction="none") - entropy
            wh_term = 0.5 * (flat[..., 2:4] - twh).square()
            weight = 2.0 - tbox[..., 2] * tbox[..., 3] / img_area
            box_term = weight * (xy_term + wh_term).sum(-1)
        loss_box = self.box_scale * (box_term * posf).sum()

        # class
        logits = flat[..., 5:]
        if self.region:
            cls_target = labels.gather(1, gt_idx)                                  # (B, N)
            ce = F.cross_entropy(logits.reshape(-1, nc), cls_target.reshape(-1), reduction="none").view(b, n)
            loss_cls = (ce * posf).sum()
        else:
            with torch.no_grad():
                cls_col = (loc * nc + labels.unsqueeze(-1).expand(b, m, k).reshape(b, -1))
                tcls = flat.new_zeros(b, n * nc).scatter_reduce(1, cls_col, live.to(flat.dtype), "amax").view(b, n, nc)
            bce = F.binary_cross_entropy_with_logits(logits, tcls, reduction="none").sum(-1)
            loss_cls = (bce * posf).sum()

        # objectness
        with torch.no_grad():
            if self.rescore:
                iou_pos = bbox_iou(pred_xyxy, cxcywh_to_xyxy(tbox)).clamp(0.0, 1.0)
                tobj = torch.where(pos, iou_pos, 0.0)
            else:
                tobj = posf
            wobj = torch.where(pos, self.object_scale, torch.where(ignored, 0.0, self.noobject_scale))
        loss_obj = (F.binary_cross_entropy_with_logits(flat[..., 4], tobj, reduction="none") * wobj).sum()

        # per-image means (each rank's share of the global batch's), Darknet's sums over 640
        items = share_of_mean(torch.stack((loss_box, loss_obj, loss_cls)) / (b * self.normalizer), b)
        return items.sum() * global_batch(b), items.detach()
