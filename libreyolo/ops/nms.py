"""Candidate selection and class-aware NMS for a batch.

Two halves: :func:`top_candidates` is fixed-shape (a per-image top-k by score), so it runs
inside the captured inference graph; :func:`nms_per_image` is data-dependent and runs
eager on the few hundred survivors. Capping the candidates per image (``max_nms``) bounds
the cost of torchvision's NMS, whose CUDA kernel builds an n x n overlap mask and walks it
on the host: on 8,400 candidates that alone costs milliseconds.
"""
from __future__ import annotations

import torch
from torchvision.ops import nms


def top_candidates(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, k: int):
    """(B, N, 4), (B, N), (B, N) -> the same for the ``k`` best-scoring anchors, sorted descending."""
    k = min(int(k), scores.shape[1])
    s, idx = scores.topk(k, dim=1, sorted=True)
    b = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, boxes.shape[-1]))
    return b, s, cls.gather(1, idx)


def nms_per_image(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, *, conf: float = 0.25,
                  iou: float = 0.45, max_det: int = 300, classes: list[int] | None = None,
                  agnostic: bool = False) -> torch.Tensor:
    """Sorted candidates (from :func:`top_candidates`) -> (K, 7) [image, x1, y1, x2, y2, conf, cls].

    Rows are grouped by image (ascending) and sorted by confidence within an image. One
    host sync reads how many candidates pass ``conf`` per image (a prefix, since they are
    sorted); each image then costs one torchvision ``nms`` call, made class-aware by
    offsetting boxes per class (the offset is computed on the device).
    """
    counts = (scores > conf).sum(1).tolist()
    out = []
    for i, n in enumerate(counts):
        if n == 0:
            continue
        b, s, c = boxes[i, :n].float(), scores[i, :n].float(), cls[i, :n]
        if classes is not None:
            keep_cls = torch.isin(c, torch.as_tensor(classes, device=c.device, dtype=c.dtype))
            b, s, c = b[keep_cls], s[keep_cls], c[keep_cls]
            if s.numel() == 0:
                continue
        if agnostic:
            keep = nms(b, s, iou)
        else:
            keep = nms(b + (c.to(b.dtype) * (b.max() + 1))[:, None], s, iou)
        keep = keep[:max_det]
        out.append(torch.cat((torch.full((keep.numel(), 1), float(i), device=b.device), b[keep],
                              s[keep, None], c[keep, None].to(b.dtype)), 1))
    if not out:
        return torch.zeros((0, 7), device=boxes.device)
    return torch.cat(out)
