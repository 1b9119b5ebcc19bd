"""Fixed-shape, sync-free NMS on the GPU, so post-processing can live inside the captured graph.

torchvision's CUDA ``nms`` builds its overlap bitmask on the device, then copies it to the
host and walks it there: a device synchronization per call, which a CUDA graph cannot
contain. That walk is the only sequential part of greedy NMS, and it is short (at most
``max_nms`` steps over candidates already sorted by score), so here one Triton program per
image does it on the device: the image's candidates sit in registers, and step ``i`` (in
score order) suppresses every later same-class candidate whose IoU with ``i`` exceeds the
threshold, unless ``i`` itself was suppressed. That is exactly greedy NMS (the suppression
rule and the IoU formula ``inter / (area_i + area_j - inter)`` are torchvision's). Class
awareness compares class ids instead of offsetting boxes, which also avoids the rounding of
large offsets.

The result is fixed-shape: (B, max_det, 6) rows ``[x1, y1, x2, y2, score, cls]`` in score
order plus a (B,) count, selected with a cumulative sum and a scatter. ``conf`` and ``iou``
are read from a small device tensor, so one captured graph serves every threshold.
Without Triton or off the GPU, :func:`available` is False and the caller uses
:func:`libreyolo.ops.nms.nms_per_image` (torchvision) instead.
"""
from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None

#: the largest candidate count one program holds in registers
MAX_CANDIDATES = 4096


def available(device: torch.device) -> bool:
    """True when the fixed-shape NMS can run on ``device``."""
    return triton is not None and torch.device(device).type == "cuda"


if triton is not None:
    @triton.jit
    def _greedy_nms_kernel(boxes_ptr, cls_ptr, count_ptr, thr_ptr, keep_ptr, K,
                           AGNOSTIC: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        n = tl.load(count_ptr + b)                  # candidates passing conf: a prefix (sorted)
        live = offs < n
        base = boxes_ptr + b * K * 4
        x1 = tl.load(base + offs * 4 + 0, mask=live, other=0.0)
        y1 = tl.load(base + offs * 4 + 1, mask=live, other=0.0)
        x2 = tl.load(base + offs * 4 + 2, mask=live, other=0.0)
        y2 = tl.load(base + offs * 4 + 3, mask=live, other=0.0)
        c = tl.load(cls_ptr + b * K + offs, mask=live, other=-1)
        area = (x2 - x1) * (y2 - y1)
        thr = tl.load(thr_ptr + 1)                  # [conf, iou]
        removed = (offs >= n).to(tl.int32)
        for i in range(0, n):
            # is candidate i still kept? (a reduction picks element i out of the block)
            gone = tl.max(tl.where(offs == i, removed, 0), axis=0)
            bx1 = tl.load(base + i * 4 + 0)
            by1 = tl.load(base + i * 4 + 1)
            bx2 = tl.load(base + i * 4 + 2)
            by2 = tl.load(base + i * 4 + 3)
            iw = tl.maximum(tl.minimum(x2, bx2) - tl.maximum(x1, bx1), 0.0)
            ih = tl.maximum(tl.minimum(y2, by2) - tl.maximum(y1, by1), 0.0)
            inter = iw * ih
            iou = inter / (area + (bx2 - bx1) * (by2 - by1) - inter)
            hit = (iou > thr) & (offs > i) & (gone == 0)
            if not AGNOSTIC:
                hit = hit & (c == tl.load(cls_ptr + b * K + i))
            removed = tl.maximum(removed, hit.to(tl.int32))
        tl.store(keep_ptr + b * K + offs, (1 - removed).to(tl.int8), mask=offs < K)


def greedy_keep(boxes: torch.Tensor, cls: torch.Tensor, count: torch.Tensor, thresholds: torch.Tensor,
                agnostic: bool = False) -> torch.Tensor:
    """(B, K, 4) float32 sorted boxes, (B, K) int32 classes, (B,) int32 prefix counts, [conf, iou]
    -> (B, K) bool: kept by greedy NMS (False beyond each image's count)."""
    bsz, k = cls.shape
    if k > MAX_CANDIDATES:
        raise ValueError(f"at most {MAX_CANDIDATES} candidates per image, got {k}")
    keep = torch.empty((bsz, k), dtype=torch.int8, device=boxes.device)
    block = max(16, triton.next_power_of_2(k))
    _greedy_nms_kernel[(bsz,)](boxes, cls, count, thresholds, keep, k, AGNOSTIC=bool(agnostic), BLOCK=block,
                               num_warps=4 if block <= 1024 else 8)
    return keep.bool()


def select_detections(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, thresholds: torch.Tensor,
                      max_det: int, *, nms: bool = True, agnostic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted candidates -> (B, max_det, 6) detections in score order and (B,) counts; fixed shape.

    ``thresholds`` is a float32 device tensor ``[conf, iou]``. ``nms=False`` (set-prediction
    heads) keeps every candidate above ``conf``.
    """
    boxes = boxes.float().contiguous()
    scores = scores.float()
    passing = scores > thresholds[0]
    if nms:
        count = passing.sum(1, dtype=torch.int32)
        keep = greedy_keep(boxes, cls.to(torch.int32).contiguous(), count, thresholds, agnostic)
    else:
        keep = passing
    rank = keep.to(torch.int32).cumsum(1) - 1
    slot = torch.where(keep & (rank < max_det), rank, max_det).long()       # the rest -> a dump row
    rows = torch.cat((boxes, scores[..., None], cls.to(torch.float32)[..., None]), -1)
    out = rows.new_zeros((rows.shape[0], max_det + 1, 6))
    out.scatter_(1, slot[..., None].expand(-1, -1, 6), rows)
    return out[:, :max_det], keep.sum(1).clamp_max(max_det)
