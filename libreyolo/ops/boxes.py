"""Fixed-shape box helpers shared by the families' decoders (graph-capturable: no syncs)."""
from __future__ import annotations

import torch


def distance_to_xyxy(points: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """Points (..., 2) and left/top/right/bottom distances (..., 4) -> xyxy boxes (..., 4)."""
    return torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)


def clip_to_canvas(box: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Clamp xyxy boxes (..., 4) into a w x h canvas."""
    if h == w:  # the square canvas predict uses: one kernel instead of five, same numbers
        return box.clamp(0, w)
    return torch.stack((box[..., 0].clamp(0, w), box[..., 1].clamp(0, h),
                        box[..., 2].clamp(0, w), box[..., 3].clamp(0, h)), -1)
