"""Hungarian matching of DETR queries to ground-truth boxes (RT-DETR / D-FINE recipe).

The cost of pairing query q with ground truth m is

    2 * focal class cost + 5 * L1(box_q, box_m) + 2 * (-GIoU(box_q, box_m))

with boxes in normalised (cx, cy, w, h) for the L1 term and the class cost
``alpha (1 - p)^gamma (-log p) - (1 - alpha) p^gamma (-log(1 - p))`` of the sigmoid
probability p of m's class at query q (alpha 0.25, gamma 2).

Split of the work: :func:`matching_cost` builds the (B, Q, M) costs of a whole batch on the
device (padded target rows included; they are ignored later), :func:`hungarian_assign` moves
every cost matrix of the batch (all decoder layers stacked) plus the target mask to the host in
one transfer, solves each image with :func:`scipy.optimize.linear_sum_assignment` over its
valid targets only, and returns the assignment as a dense (L, B, Q) index tensor: the target row
matched to each query, -1 where none. Dense assignments keep every later loss computation
fixed-shape (gathers and masks, no boolean indexing).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn
from torchvision.ops import box_convert

__all__ = ["HungarianMatcher", "matching_cost", "hungarian_assign", "pairwise_giou", "union_assignment"]

#: finite stand-in for NaN / inf costs (linear_sum_assignment rejects non-finite entries)
COST_CAP = 1e8


def pairwise_giou(a: Tensor, b: Tensor) -> Tensor:
    """Generalized IoU of every box of ``a`` (..., N, 4) with every box of ``b`` (..., M, 4),
    both xyxy, batched over the leading dimensions -> (..., N, M).

    Equal to :func:`torchvision.ops.generalized_box_iou` per batch element (which is 2-D only).
    """
    a, b = a.unsqueeze(-2), b.unsqueeze(-3)
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a + area_b - inter
    iou = inter / union
    lt_c = torch.minimum(a[..., :2], b[..., :2])
    rb_c = torch.maximum(a[..., 2:], b[..., 2:])
    wh_c = (rb_c - lt_c).clamp(min=0)
    area_c = wh_c[..., 0] * wh_c[..., 1]
    return iou - (area_c - union) / area_c


@torch.no_grad()
def matching_cost(logits: Tensor, boxes: Tensor, labels: Tensor, gt_boxes: Tensor, *,
                  cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0,
                  alpha: float = 0.25, gamma: float = 2.0) -> Tensor:
    """The (B, Q, M) matching cost of a batch, computed where the tensors live.

    ``logits`` (B, Q, nc) pre-sigmoid, ``boxes`` (B, Q, 4) and ``gt_boxes`` (B, M, 4) normalised
    cxcywh, ``labels`` (B, M) long in [0, nc). Padded target rows get a cost too; pass the mask
    to :func:`hungarian_assign`, which leaves them out.
    """
    b, q, _ = logits.shape
    m = labels.shape[1]
    prob = logits.float().sigmoid().gather(2, labels.unsqueeze(1).expand(b, q, m))   # (B, Q, M)
    pos = alpha * (1 - prob) ** gamma * -(prob + 1e-8).log()
    neg = (1 - alpha) * prob ** gamma * -(1 - prob + 1e-8).log()
    boxes, gt_boxes = boxes.float(), gt_boxes.float()
    l1 = torch.cdist(boxes, gt_boxes, p=1)
    giou = pairwise_giou(box_convert(boxes, "cxcywh", "xyxy"), box_convert(gt_boxes, "cxcywh", "xyxy"))
    return cost_class * (pos - neg) + cost_bbox * l1 - cost_giou * giou


def union_assignment(assign: np.ndarray) -> np.ndarray:
    """D-FINE's union ("GO") matching of several layers' assignments, on the host.

    ``assign`` (L, B, Q) int, target row per query or -1. Every (query, target) pair proposed by
    any layer is counted; each query keeps the target it was paired with most often (ties: the
    lower target row). A target may end up with several queries. Returns (B, Q) int, -1 = none.
    """
    n_layers, b, q = assign.shape
    out = np.full((b, q), -1, dtype=np.int64)
    for i in range(b):
        a = assign[:, i, :]                                        # (L, Q)
        valid = a >= 0
        if not valid.any():
            continue
        m = int(a.max()) + 1
        counts = np.zeros((q, m), dtype=np.int64)
        rows = np.broadcast_to(np.arange(q), a.shape)[valid]
        np.add.at(counts, (rows, a[valid]), 1)
        best = counts.argmax(1)                                    # first maximum = lower row
        out[i] = np.where(counts.max(1) > 0, best, -1)
    return out


def hungarian_assign(costs: Tensor, mask: Tensor, union_of: Sequence[int] | None = None
                     ) -> tuple[Tensor, Tensor | None]:
    """Solve the assignment of every (layer, image) in ``costs`` (L, B, Q, M) on the host.

    ``mask`` (B, M) bool marks the real target rows: only those columns enter image b's
    problem (an image without targets matches nothing). Costs and mask go to the host in one
    transfer. Returns ``assign`` (L, B, Q) long on the costs' device (target row per query, -1
    where unmatched; ``min(Q, count)`` matches per image) and, when ``union_of`` lists layer
    indices, their :func:`union_assignment` (B, Q) (else None).
    """
    n_layers, b, q, m = costs.shape
    packed = torch.cat([costs.detach().float().reshape(-1), mask.reshape(-1).float()]).cpu().numpy()
    cost = np.nan_to_num(packed[:n_layers * b * q * m].reshape(n_layers, b, q, m),
                         nan=COST_CAP, posinf=COST_CAP, neginf=-COST_CAP)
    valid = packed[n_layers * b * q * m:].reshape(b, m) > 0.5
    assign = np.full((n_layers, b, q), -1, dtype=np.int64)
    for i in range(b):
        cols = np.flatnonzero(valid[i])
        if cols.size == 0:
            continue
        for layer in range(n_layers):
            rows, picked = linear_sum_assignment(cost[layer, i][:, cols])
            assign[layer, i, rows] = cols[picked]
    union = union_assignment(assign[list(union_of)]) if union_of is not None else None
    host = np.concatenate([assign.reshape(-1), union.reshape(-1)]) if union is not None else assign.reshape(-1)
    dev = torch.from_numpy(host).to(costs.device, non_blocking=True)
    out = dev[:assign.size].view(n_layers, b, q)
    return out, (dev[assign.size:].view(b, q) if union is not None else None)


class HungarianMatcher(nn.Module):
    """One-to-one matching of several output sets (decoder layers, encoder proposals) at once.

    ``forward(sets, labels, gt_boxes, mask, union_of=None)``: ``sets`` is a list of
    ``(logits (B, Q, nc), boxes (B, Q, 4) cxcywh)``, all with the same Q; ``labels`` (B, M) long,
    ``gt_boxes`` (B, M, 4) normalised cxcywh, ``mask`` (B, M) bool. The costs are built on the
    device, the assignment on the host (one transfer each way). Returns (L, B, Q) long target
    rows (-1 = unmatched) and the optional union assignment (see :func:`hungarian_assign`).
    """

    def __init__(self, cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0,
                 alpha: float = 0.25, gamma: float = 2.0):
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("at least one matching cost weight must be non-zero")
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.alpha, self.gamma = alpha, gamma

    @torch.no_grad()
    def forward(self, sets: Sequence[tuple[Tensor, Tensor]], labels: Tensor, gt_boxes: Tensor, mask: Tensor,
                union_of: Sequence[int] | None = None) -> tuple[Tensor, Tensor | None]:
        costs = torch.stack([matching_cost(lg, bx, labels, gt_boxes, cost_class=self.cost_class,
                                           cost_bbox=self.cost_bbox, cost_giou=self.cost_giou,
                                           alpha=self.alpha, gamma=self.gamma) for lg, bx in sets])
        return hungarian_assign(costs, mask, union_of)
