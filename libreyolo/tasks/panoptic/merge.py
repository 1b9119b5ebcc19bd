"""Panoptic inference: per-query classes and masks -> one non-overlapping segment map.

The MaskFormer / Mask2Former recipe (HF's ``post_process_panoptic_segmentation``, LibreYOLO
1.6.0's EoMT): a query is kept when its best class (over the ``nc + 1`` logits) is not no-object and
its probability exceeds ``conf``; every pixel goes to the kept query with the highest
``score * sigmoid(mask)``; a query's segment is the pixels it won where its own mask probability is
at least ``mask_thresh``; a query that won no more than ``overlap`` of its own binarized area (or
nothing) is dropped as occluded; the queries of one stuff class share one segment, every thing
query is its own. Segment ids count from 1 in query order; 0 is void.

Everything here has fixed shapes and no host synchronisation (the kept set is a mask, not a
selection; counts are scatter-adds into fixed-size tensors): the same function runs inside
validation's device stage (the stride-4 grid of the canvas, all queries) and after predict's
stage (each image's pixels, the kept queries only). The masks come from a callable per chunk of queries, so an image of any size holds at most ``chunk``
query maps at a time (a running best score and winner per pixel instead of a (Q, H, W) argmax).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

#: query masks held at a time per image
CHUNK = 32


@dataclass
class Merged:
    """One image's merge: ``ids`` (H, W) int32 segment ids (0 void); per query: ``segment`` (n,)
    its segment id (0: no segment), ``start`` whether it opened that segment (the segment's
    class, score and thing flag are the opening query's), ``area`` (n,) pixels of the segment it
    opened (0 for the others); ``category`` (H, W) int64 each pixel's class (``nc`` where void)."""

    ids: torch.Tensor
    segment: torch.Tensor
    start: torch.Tensor
    area: torch.Tensor
    category: torch.Tensor


def query_scores(class_logits: torch.Tensor, conf: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(..., Q, nc + 1) class logits -> score (..., Q), label (..., Q), kept (..., Q) bool: best
    class over all logits, not no-object (the last) and above ``conf``."""
    nc = class_logits.shape[-1] - 1
    score, label = class_logits.float().softmax(-1).max(-1)
    return score, label, (label != nc) & (score > conf)


def merge(score: torch.Tensor, label: torch.Tensor, kept: torch.Tensor, probs: Callable[[int, int], torch.Tensor],
          hw: tuple[int, int], stuff: torch.Tensor, *, mask_thresh: float, overlap: float,
          chunk: int = CHUNK) -> Merged:
    """Merge ``n`` queries of one image (see the module docstring).

    ``score`` / ``label`` / ``kept`` (n,); ``probs(start, end)`` the (end - start, H, W) mask
    probabilities of those queries; ``stuff`` (nc,) bool: which classes are stuff."""
    n = int(score.shape[0])
    dev = score.device
    nc = int(stuff.shape[0])
    if n == 0:   # nothing kept (a static shape: no query at all)
        zero = torch.zeros(0, dtype=torch.long, device=dev)
        return Merged(torch.zeros(hw, dtype=torch.int32, device=dev), zero, zero.bool(), zero,
                      torch.full(hw, nc, dtype=torch.long, device=dev))
    best = torch.full(hw, -1.0, device=dev)
    best_prob = torch.zeros(hw, device=dev)
    winner = torch.zeros(hw, dtype=torch.long, device=dev)
    own_area = torch.zeros(n, device=dev)
    weight = torch.where(kept, score.float(), torch.full_like(score.float(), -1.0))
    for s in range(0, n, chunk):
        p = probs(s, min(n, s + chunk)).float()                                        # (c, H, W)
        own_area[s:s + p.shape[0]] = (p >= mask_thresh).flatten(1).sum(1).float()
        w = torch.where(weight[s:s + p.shape[0], None, None] >= 0, p * weight[s:s + p.shape[0], None, None],
                        torch.full_like(p, -1.0))
        val, idx = w.max(0)                                                             # first max in the chunk
        better = val > best                                                             # strict: earlier chunk wins ties
        best = torch.where(better, val, best)
        winner = torch.where(better, idx + s, winner)
        best_prob = torch.where(better, p.gather(0, idx[None])[0], best_prob)
    own_at = best_prob >= mask_thresh
    flat = winner.reshape(-1)
    won_area = _count(flat, n).float()
    final_area = _count(flat, n, own_at.reshape(-1)).float()
    valid = kept & (won_area > 0) & (own_area > 0) & (final_area > 0) & (won_area > overlap * own_area)
    is_stuff = stuff[label.clamp(max=nc - 1)] & valid & (label < nc)
    order = torch.arange(n, device=dev)
    same = (label[:, None] == label[None, :]) & is_stuff[:, None] & is_stuff[None, :]
    first = torch.where(is_stuff, same.float().argmax(1), order)                       # a stuff class's first query
    start = valid & (first == order)
    rank = torch.cumsum(start.long(), 0)
    segment = torch.where(valid, rank[first], torch.zeros_like(rank))
    pixel_valid = own_at & valid[winner]
    ids = torch.where(pixel_valid, segment[winner], torch.zeros_like(winner))
    category = torch.where(pixel_valid, label[winner], torch.full_like(winner, nc))
    area = torch.where(start, _count(ids.reshape(-1), n + 1)[segment], torch.zeros_like(segment))
    return Merged(ids.to(torch.int32), segment, start, area, category)


def _count(index: torch.Tensor, n: int, where: torch.Tensor | None = None) -> torch.Tensor:
    """(n,) int64 occurrences of 0..n-1 in ``index`` (only where ``where``): a fixed-size
    scatter-add, unlike ``bincount``, whose output size is read from the data."""
    ones = torch.ones_like(index) if where is None else where.long()
    return torch.zeros(n, dtype=torch.long, device=index.device).scatter_add_(0, index, ones)
