"""Sliced (tiled) inference geometry and the merge of detections across tiles.

An image larger than a tile is cut into overlapping tiles (SAHI's sliced prediction). Every tile
of an image has the same shape - the last tile of a row or column is moved back to end at the
image's edge rather than padded or shrunk - so the tiles go through the predict stage as one
fixed-shape batch (one captured graph). An image no larger than a tile along an axis has tiles of
its own extent along that axis. :func:`tile_origins` places the tiles, :func:`cut_tiles` cuts
them as one batch, :func:`shift_to_image` maps each tile's boxes back to image pixels and
:func:`merge_detections` merges the union (tiles, a full-image pass, augmented views) with
class-aware NMS on the tensors' device: by IoU (torchvision's ``batched_nms``) or by IoS, the
intersection over the smaller box (SAHI's metric for tiles: a box cut by a tile's edge is
mostly inside the whole one, with a low IoU).
"""
from __future__ import annotations

import math

import torch

from ..device import require_torch_pair

__all__ = ["MATCH_METRICS", "check_tiling", "cut_tiles", "merge_detections", "shift_to_image", "tile_origins",
           "tile_shape"]

#: how :func:`merge_detections` matches two boxes of one object
MATCH_METRICS = ("iou", "ios")


def check_tiling(tile_size: int, overlap_ratio: float) -> None:
    """One clear ValueError for a tile size or overlap ratio tiling cannot use."""
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
        raise ValueError(f"tile: expected a positive integer, got {tile_size!r}")
    if isinstance(overlap_ratio, bool) or not isinstance(overlap_ratio, (int, float)) \
            or not 0.0 <= overlap_ratio < 1.0:
        raise ValueError(f"overlap_ratio: expected a number in [0, 1), got {overlap_ratio!r}")


def _starts(length: int, tile: int, step: int) -> list[int]:
    if length <= tile:
        return [0]
    n = math.ceil((length - tile) / step) + 1
    # the last tile ends at the image's edge; the others step evenly from 0
    return sorted({min(i * step, length - tile) for i in range(n)})


def tile_origins(height: int, width: int, tile_size: int, overlap_ratio: float) -> list[tuple[int, int]]:
    """The (y0, x0) of each tile, row by row. Neighbours overlap by at least
    ``overlap_ratio * tile_size`` pixels; an image no larger than one tile is one tile at (0, 0)."""
    check_tiling(tile_size, overlap_ratio)
    step = max(1, tile_size - int(round(overlap_ratio * tile_size)))
    return [(y, x) for y in _starts(height, tile_size, step) for x in _starts(width, tile_size, step)]


def tile_shape(height: int, width: int, tile_size: int) -> tuple[int, int]:
    """(height, width) of every tile of an image: ``tile_size``, or the image's own extent along
    an axis where it is smaller."""
    return min(int(height), tile_size), min(int(width), tile_size)


def cut_tiles(image: torch.Tensor, origins: list[tuple[int, int]], shape: tuple[int, int]) -> torch.Tensor:
    """The tiles of an (H, W, C) image as one contiguous (N, th, tw, C) batch (``shape``: (th, tw),
    from :func:`tile_shape`; each tile lies inside the image)."""
    th, tw = shape
    h, w = int(image.shape[0]), int(image.shape[1])
    for y, x in origins:
        if y < 0 or x < 0 or y + th > h or x + tw > w:
            raise ValueError(f"cut_tiles: a {th}x{tw} tile at (y={y}, x={x}) leaves the {h}x{w} image")
    return torch.stack([image[y:y + th, x:x + tw] for y, x in origins])


def shift_to_image(dets: torch.Tensor, tile_index: torch.Tensor, origins: list[tuple[int, int]]) -> torch.Tensor:
    """Detections (K, 6) ``[x1, y1, x2, y2, conf, cls]`` in their tiles' pixels -> the image's
    pixels (a new tensor); ``tile_index`` (K,) says whose tile each row is."""
    xy = torch.tensor([[x, y, x, y] for y, x in origins], dtype=dets.dtype, device=dets.device)
    out = dets.clone()
    out[:, :4] += xy[tile_index.long()]
    return out


def _ios_keep(boxes: torch.Tensor, groups: torch.Tensor, threshold: float) -> torch.Tensor:
    """Greedy NMS by IoS over score-sorted boxes: the kept indices, ascending. Box i is dropped
    when a kept box of higher score in its group covers more than ``threshold`` of the smaller of
    the two. Per group, solved as the fixed point of ``keep[i] = not any(keep[j] and match[j, i]
    for j < i)`` - the greedy pass's unique solution, reached from all-kept in at most as many
    rounds as the longest chain of matches - so it runs as a few tensor ops on the device."""
    kept = []
    for g in groups.unique():
        idx = (groups == g).nonzero().squeeze(1)
        b = boxes[idx]
        area = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
        inter = (torch.minimum(b[:, None, 2:], b[None, :, 2:]) - torch.maximum(b[:, None, :2], b[None, :, :2])
                 ).clamp(min=0).prod(-1)
        smaller = torch.minimum(area[:, None], area[None, :]).clamp(min=1e-9)
        match = (inter / smaller > threshold).triu(1)   # j suppresses i only for j < i
        keep = torch.ones(len(idx), dtype=torch.bool, device=boxes.device)
        for _ in range(len(idx)):
            new = ~(match & keep[:, None]).any(0)
            if torch.equal(new, keep):
                break
            keep = new
        kept.append(idx[keep])
    return torch.cat(kept).sort().values


def merge_detections(dets: torch.Tensor, *, image_size: tuple[int, int], iou: float = 0.45, max_det: int = 300,
                     agnostic: bool = False, metric: str = "iou") -> torch.Tensor:
    """One image's detections (K, 6) ``[x1, y1, x2, y2, conf, cls]`` from several passes (tiles
    already shifted to image pixels, a full-image pass, augmented views) -> the merged (k, 6),
    best first, on ``dets``' device.

    Boxes are clipped to ``image_size`` (height, width); a box matching a better one of its class
    (``agnostic``: of any class) by more than ``iou`` is dropped, the match measured by ``metric``:
    ``"iou"`` (torchvision's ``batched_nms``) or ``"ios"`` (intersection over the smaller box).
    At most ``max_det`` are kept.
    """
    if metric not in MATCH_METRICS:
        raise ValueError(f"merge metric must be one of {', '.join(MATCH_METRICS)}, got {metric!r}")
    h, w = image_size
    dets = dets.float()
    b = torch.stack([dets[:, 0].clamp(0, w), dets[:, 1].clamp(0, h), dets[:, 2].clamp(0, w),
                     dets[:, 3].clamp(0, h)], 1)
    dets = torch.cat([b, dets[:, 4:6]], 1)
    if dets.shape[0] == 0:
        return dets
    groups = torch.zeros_like(dets[:, 5]) if agnostic else dets[:, 5]
    if metric == "iou":
        require_torch_pair()   # one message naming both versions, not torchvision's own
        from torchvision.ops import batched_nms
        keep = batched_nms(b, dets[:, 4], groups, iou)
    else:
        order = dets[:, 4].argsort(descending=True, stable=True)
        keep = order[_ios_keep(b[order], groups[order], iou)]
    return dets[keep[:max_det]]
