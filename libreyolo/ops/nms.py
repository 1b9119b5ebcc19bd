"""Confidence filtering + class-aware NMS for a whole batch in one pass.

One ``nonzero`` picks the candidates of every image, one torchvision ``batched_nms``
suppresses them (boxes of different images or classes never suppress each other), and
the per-image ``max_det`` cap is applied with a sort instead of a Python loop, so the
cost is a handful of kernels and syncs whatever the batch size.
"""
from __future__ import annotations

import torch
from torchvision.ops import batched_nms


def batched_detections(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, *,
                       num_classes: int, conf: float = 0.25, iou: float = 0.45, max_det: int = 300,
                       classes: list[int] | None = None, agnostic: bool = False) -> torch.Tensor:
    """boxes (B, N, 4) xyxy, scores (B, N), cls (B, N) -> (K, 7) [image, x1, y1, x2, y2, conf, cls].

    Rows are grouped by image (ascending) and sorted by confidence within an image.
    """
    mask = scores > conf
    if classes is not None:
        allowed = torch.as_tensor(list(classes), device=cls.device, dtype=cls.dtype)
        mask &= torch.isin(cls, allowed)
    img, idx = mask.nonzero(as_tuple=True)
    b = boxes[img, idx].float()
    s = scores[img, idx].float()
    c = cls[img, idx]
    if img.numel() == 0:
        return torch.zeros((0, 7), device=boxes.device)
    groups = img if agnostic else img * num_classes + c
    keep = batched_nms(b, s, groups, iou)  # sorted by score, descending
    img_k = img[keep]
    order = torch.sort(img_k, stable=True).indices  # group by image, keep score order
    keep, img_k = keep[order], img_k[order]
    counts = torch.bincount(img_k, minlength=boxes.shape[0])
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(keep.numel(), device=keep.device) - starts[img_k]
    sel = rank < max_det
    keep, img_k = keep[sel], img_k[sel]
    return torch.cat((img_k.unsqueeze(1).float(), b[keep], s[keep].unsqueeze(1),
                      c[keep].unsqueeze(1).float()), 1)
