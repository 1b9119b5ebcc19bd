"""Sliced (tiled) inference geometry and the merge of detections across tiles.

An image larger than the network's input is cut into fixed-size, overlapping tiles (SAHI's
sliced prediction). Every tile has the same shape - edge tiles are padded, not shrunk - so one
captured stage serves them all. :func:`tile_origins` places the tiles, :func:`cut_tiles` cuts
and pads them as one batch, and :func:`merge_tiles` shifts each tile's boxes back to image
coordinates and merges them (and a full-image pass, if given) with class-aware NMS on the
tensors' device.
"""
from __future__ import annotations

import math

import torch

__all__ = ["check_tiling", "cut_tiles", "merge_tiles", "tile_origins"]


def check_tiling(tile_size: int, overlap_ratio: float, stride: int = 1) -> None:
    """One clear ValueError for a tile size or overlap ratio tiling cannot use."""
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
        raise ValueError(f"tile_size: expected a positive integer, got {tile_size!r}")
    if stride > 1 and tile_size % stride:
        raise ValueError(f"tile_size: {tile_size} is not a multiple of the model's stride {stride}")
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


def cut_tiles(image: torch.Tensor, origins: list[tuple[int, int]], tile_size: int,
              pad_value: float = 0.0) -> torch.Tensor:
    """The tiles of a (C, H, W) image as one (N, C, tile_size, tile_size) batch; parts past the
    image's right or bottom edge are ``pad_value``."""
    c = image.shape[0]
    out = image.new_full((len(origins), c, tile_size, tile_size), pad_value)
    for i, (y, x) in enumerate(origins):
        crop = image[:, y:y + tile_size, x:x + tile_size]
        out[i, :, :crop.shape[1], :crop.shape[2]] = crop
    return out


def merge_tiles(per_tile: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], origins: list[tuple[int, int]],
                *, image_size: tuple[int, int], iou: float = 0.45, max_det: int = 300, agnostic: bool = False,
                full: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None):
    """Merge the detections of the tiles (and of a full-image pass) into one image's.

    ``per_tile`` holds, per tile, (boxes xyxy in the tile's pixels, scores, classes). Boxes are
    shifted by their tile's origin, clipped to ``image_size`` (height, width), and the union goes
    through class-aware NMS (``agnostic``: across classes), best ``max_det`` kept, by score.
    Returns (boxes, scores, classes) on the inputs' device.
    """
    from torchvision.ops import batched_nms

    if len(per_tile) != len(origins):
        raise ValueError(f"merge_tiles: {len(per_tile)} tiles' detections for {len(origins)} origins")
    boxes, scores, classes = [], [], []
    for (b, s, c), (y, x) in zip(per_tile, origins):
        boxes.append(b + b.new_tensor([x, y, x, y]))
        scores.append(s)
        classes.append(c)
    if full is not None:
        boxes.append(full[0])
        scores.append(full[1])
        classes.append(full[2])
    b = torch.cat(boxes)
    s = torch.cat(scores)
    c = torch.cat(classes)
    h, w = image_size
    b = torch.stack([b[:, 0].clamp(0, w), b[:, 1].clamp(0, h), b[:, 2].clamp(0, w), b[:, 3].clamp(0, h)], 1)
    keep = batched_nms(b.float(), s.float(), torch.zeros_like(c) if agnostic else c, iou)[:max_det]
    return b[keep], s[keep], c[keep]
