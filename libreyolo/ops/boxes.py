"""Fixed-shape box helpers shared by the families' decoders (graph-capturable: no syncs)."""
from __future__ import annotations

import torch


def grid_points(h: int, w: int, stride: float, offset: float, device, dtype) -> torch.Tensor:
    """(1, h*w, 2) cell points (col + offset, row + offset) * stride, row-major."""
    ys = (torch.arange(h, device=device, dtype=dtype) + offset) * stride
    xs = (torch.arange(w, device=device, dtype=dtype) + offset) * stride
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack((gx, gy), -1).reshape(1, h * w, 2)


def distance_to_xyxy(points: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """Points (..., 2) and left/top/right/bottom distances (..., 4) -> xyxy boxes (..., 4)."""
    return torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)


def clip_to_canvas(box: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Clamp xyxy boxes (..., 4) into a w x h canvas."""
    return torch.stack((box[..., 0].clamp(0, w), box[..., 1].clamp(0, h),
                        box[..., 2].clamp(0, w), box[..., 3].clamp(0, h)), -1)
