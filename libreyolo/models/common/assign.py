"""Label-assignment pieces shared by the CNN detector losses (YOLOv9, YOLOX, YOLOv7, RTMDet, PicoDet).

Everything here works on fixed shapes and reads no tensor value on the host, so the losses that
use it can be captured in a CUDA graph. Targets come padded to a fixed ``M`` per image with a
(B, M) validity mask; a gt x prior grid is (B, M, N).

* priors: :func:`grid_key`, :func:`prior_grid` and :func:`cached` build the per-stride prior
  points once per map shape (call a loss's ``prepare`` before capture);
* padded targets: :func:`sanitize_targets` (padding rows made harmless);
* candidates: :func:`points_in_boxes` and :func:`points_near_centres`;
* class costs: :func:`gather_classes`, :func:`class_cost` (sum over classes with one positive
  class, without a (B, M, N, C) tensor) and :func:`pairwise_class_cost` (YOLOX / YOLOv7's BCE);
* selection: :func:`topk_mask` (a data-dependent per-row count as a fixed ``topk`` plus a
  ``rank < count`` mask), :func:`resolve_conflicts` (one gt per prior) and
  :func:`dynamic_k_matching` (SimOTA's dynamic k, used by YOLOX, YOLOv7, RTMDet and PicoDet).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

BCE_LOG_MIN = -100.0   # F.binary_cross_entropy clamps its logs here
COST_CAP = 1e30        # real costs are clamped here so that +inf marks only the pairs that may not match


class DenseMapsLoss(nn.Module):
    """The entry of a loss over a head's ``(cls_maps, box_maps)``: autocast off, float32 maps and
    targets, and one all-padding target row for a batch without objects (a shape-level, static
    decision, so a captured step stays valid). Subclasses implement ``_compute(cls_maps, box_maps,
    targets, mask) -> (loss, items)``."""

    def forward(self, outputs, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        cls_maps, box_maps = outputs
        with torch.autocast(device_type=cls_maps[0].device.type, enabled=False):
            targets, mask = targets.float(), mask.bool()
            if targets.shape[1] == 0:
                targets, mask = targets.new_zeros(targets.shape[0], 1, 5), mask.new_zeros(mask.shape[0], 1)
            return self._compute([c.float() for c in cls_maps], [d.float() for d in box_maps], targets, mask)


# -- priors --------------------------------------------------------------------------------------
def grid_key(maps_shapes: Iterable[Sequence[int]], n_levels: int, device: torch.device | str,
             dtype: torch.dtype = torch.float32) -> tuple[tuple[tuple[int, int], ...], torch.dtype, torch.device]:
    """``(hw per level, dtype, device)``: the cache key of a loss's prior grid.

    ``maps_shapes`` holds one shape per level whose last two entries are (H, W). The losses
    compute in float32, so half and bfloat16 map to float32; ``cuda`` gets its current index.
    """
    hw = tuple((int(s[-2]), int(s[-1])) for s in maps_shapes)
    if len(hw) != n_levels:
        raise ValueError(f"expected {n_levels} feature maps, got {len(hw)}")
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return hw, dtype, device


def prior_grid(hw: Sequence[tuple[int, int]], strides: Sequence[int], offset: float, pixels: bool,
               dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """Prior points (N, 2) as (x, y) = (col + offset, row + offset), times the stride when
    ``pixels``, level after level in row-major order, and their strides (N, 1)."""
    points, strides_out = [], []
    for (h, w), s in zip(hw, strides):
        ys = torch.arange(h, dtype=dtype, device=device) + offset
        xs = torch.arange(w, dtype=dtype, device=device) + offset
        if pixels:
            ys, xs = ys * s, xs * s
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((gx.reshape(-1), gy.reshape(-1)), -1))
        strides_out.append(torch.full((h * w, 1), float(s), dtype=dtype, device=device))
    return torch.cat(points), torch.cat(strides_out)


def cached(cache: dict, key, build: Callable[[], tuple[Tensor, ...]], limit: int = 16) -> tuple[Tensor, ...]:
    """``cache[key]``, built by ``build()`` on a miss (the cache is emptied past ``limit`` entries).

    Under ``torch.compile`` the cache is bypassed (``build()`` is traced into the graph): a traced
    lookup guards on the dict's contents and the traced miss fills it, so the compiled function
    would recompile - one more dynamo trace - on its second call."""
    if torch.compiler.is_compiling():
        return build()
    hit = cache.get(key)
    if hit is None:
        hit = build()
        if len(cache) > limit:
            cache.clear()
        cache[key] = hit
    return hit


def join_levels(maps: Sequence[Tensor]) -> Tensor:
    """Per-level (B, C, h, w) maps -> (B, N, C): the levels one after another, each row-major
    (one concatenation, seen transposed), so that decoding runs once over all levels."""
    return torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)


def level_priors(cache: dict, hw: Sequence[tuple[int, int]], strides: Sequence[int], offset: float,
                 pixels: bool, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """:func:`prior_grid` as (1, N, 2) points and (1, N, 1) strides, cached in ``cache``."""
    key = (tuple(hw), tuple(strides), offset, pixels, dtype, device)
    return cached(cache, key, lambda: tuple(t[None] for t in prior_grid(hw, strides, offset, pixels, dtype, device)))


# -- candidates ----------------------------------------------------------------------------------
def points_in_boxes(points: Tensor, boxes: Tensor, eps: float = 0.0) -> Tensor:
    """Whether each point lies more than ``eps`` inside every edge of its box, broadcasting
    ``points`` (..., 2) against xyxy ``boxes`` (..., 4): ``points_in_boxes(pts, gt.unsqueeze(-2))``
    gives the (B, M, N) gt x prior grid for (N, 2) points and (B, M, 4) gts."""
    return torch.cat((points - boxes[..., :2], boxes[..., 2:] - points), -1).amin(-1) > eps


def points_near_centres(points: Tensor, boxes: Tensor, radius: Tensor) -> Tensor:
    """(B, M, N) bool: the (N, 2) point lies strictly within ``radius`` (N, 1) of the centre of the
    (B, M, 4) xyxy gt on both axes (the centre-sampling square of SimOTA)."""
    centres = ((boxes[..., :2] + boxes[..., 2:]) / 2).unsqueeze(-2)                # (B, M, 1, 2)
    return points_in_boxes(points, torch.cat((centres - radius, centres + radius), -1))


def sanitize_targets(gt_labels: Tensor, gt_boxes: Tensor, mask_gt: Tensor, nc: int, dtype: torch.dtype
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """(valid (B, M) bool, labels (B, M) long in [0, nc), boxes (B, M, 4) in ``dtype``): padding rows
    become class 0 at the zero box, so whatever they held cannot produce NaN/inf or bad indices."""
    valid = mask_gt.bool()
    labels = torch.where(valid, gt_labels.to(dtype), 0).long().clamp(0, nc - 1)
    boxes = torch.where(valid.unsqueeze(-1), gt_boxes.to(dtype), 0)
    return valid, labels, boxes


# -- class costs ---------------------------------------------------------------------------------
def gather_classes(values: Tensor, labels: Tensor) -> Tensor:
    """(B, N, C) per-prior class values and (B, M) long labels -> (B, M, N): every prior's value at
    every gt's class."""
    b, n, _ = values.shape
    m = labels.shape[1]
    return values.transpose(1, 2).gather(1, labels.unsqueeze(-1).expand(b, m, n))


def class_cost(neg: Tensor, labels: Tensor, pos: Tensor) -> Tensor:
    """A class cost summed over classes where each gt has one positive class, (B, M, N).

    ``neg`` (B, N, C) is each class's cost against target 0, ``pos`` (B, M, N) the cost of the
    gt's own class against its (soft) target. Computed as ``sum_c neg - neg[label] + pos``, in
    O(B * N * (C + M)) memory instead of a (B, M, N, C) tensor.
    """
    return neg.sum(-1).unsqueeze(1) - gather_classes(neg, labels) + pos


def pairwise_class_cost(probs: Tensor, labels: Tensor) -> Tensor:
    """Summed BCE of every prior's class probabilities against every gt's one-hot class (YOLOX,
    YOLOv7). ``probs`` (B, N, nc) in [0, 1], ``labels`` (B, M) long -> (B, M, N); equal to
    ``F.binary_cross_entropy(p, one_hot(c)).sum(-1)`` per pair (logs clamped at -100)."""
    neg = -torch.log1p(-probs).clamp_min(BCE_LOG_MIN)
    pos = -gather_classes(probs.log().clamp_min(BCE_LOG_MIN), labels)
    return class_cost(neg, labels, pos)


# -- selection -----------------------------------------------------------------------------------
def topk_mask(values: Tensor, k: int, largest: bool = True, count: Tensor | None = None) -> Tensor:
    """0/1 mask (``values``' shape and dtype) of each row's ``k`` largest (or smallest) entries
    along the last dimension; ``k`` is capped at the row length.

    With ``count`` (``values.shape[:-1]``), only the first ``count`` of them in rank order are
    kept (``rank < count``): a per-row, data-dependent number of picks on a fixed shape.
    """
    k = min(k, values.shape[-1])
    idx = values.topk(k, -1, largest=largest).indices
    if count is None:
        return torch.zeros_like(values).scatter_(-1, idx, 1.0)
    rank = torch.arange(k, device=values.device, dtype=count.dtype)
    take = (rank < count.unsqueeze(-1)).to(values.dtype)
    return torch.zeros_like(values).scatter_(-1, idx, take)


def resolve_conflicts(matching: Tensor, winner: Tensor) -> Tensor:
    """Give a prior claimed by several gts to one gt only.

    ``matching`` (B, M, N) 0/1, ``winner`` (B, 1, N) long: the gt index each prior goes to when it
    is claimed more than once (argmin of a cost or argmax of an IoU over the gts). Priors claimed
    once or not at all are left as they are.
    """
    m = matching.shape[1]
    claims = matching.sum(1, keepdim=True)                                          # (B, 1, N)
    gts = torch.arange(m, device=matching.device).view(1, m, 1)
    return torch.where(claims > 1, (gts == winner).to(matching.dtype), matching)


def dynamic_k_matching(cost: Tensor, ious: Tensor, candidate: Tensor, valid: Tensor, topk: int
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """SimOTA's dynamic-k matching on a (B, M, N) gt x prior grid, fixed-shape.

    ``cost`` and ``ious`` (B, M, N), ``candidate`` (B, N) bool (the priors that may match),
    ``valid`` (B, M) bool (the real gts). Each real gt takes its ``k = max(1, floor(sum of its
    topk best candidate IoUs))`` cheapest candidates, through one ``topk`` over a fixed ``topk``
    and a ``rank < k`` mask; a prior taken by several gts goes to the real gt of least cost.
    Finite costs are clamped at 1e30 so that they still rank before the +inf of the pairs that
    may not match. Returns ``matching`` (B, M, N) 0/1 in ``cost``'s dtype (at most one gt per
    prior), ``fg`` (B, N) bool and ``gt_idx`` (B, N) long (0 off the foreground).
    """
    allowed = valid.unsqueeze(-1) & candidate.unsqueeze(1)                          # (B, M, N)
    cost = torch.where(allowed, cost.clamp_max(COST_CAP), torch.inf)
    k = min(topk, cost.shape[-1])
    dyn_k = torch.where(allowed, ious, 0.0).topk(k, -1).values.sum(-1).floor().clamp_min(1.0)
    matching = topk_mask(cost, k, largest=False, count=dyn_k) * allowed.to(cost.dtype)
    matching = resolve_conflicts(matching, cost.argmin(1, keepdim=True))
    return matching, matching.sum(1) > 0, matching.argmax(1)
