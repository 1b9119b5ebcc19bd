"""Multi-scale deformable attention (Deformable-DETR), in RT-DETR's and RT-DETRv2's forms.

Each query predicts, per head, a few sampling offsets around its reference box on every
feature level and a softmax weight per sample; the values are bilinearly sampled with
``grid_sample`` (no custom kernel, fixed shapes, capturable). RT-DETRv2 allows a different
number of points per level and keeps the per-point offset scale (1 / points of that level) as
the ``num_points_scale`` buffer in its checkpoints; RT-DETR uses the same scale but does not
store it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def deformable_sample(value: torch.Tensor, shapes: list[tuple[int, int]], locations: torch.Tensor,
                      weights: torch.Tensor, points: list[int]) -> torch.Tensor:
    """Weighted bilinear sampling of multi-level values.

    value (B, sum(h*w), heads, c); locations (B, Lq, heads, P, 2) in [0, 1] (x, y) with the
    P = sum(points) samples grouped level by level; weights (B, Lq, heads, P).
    Returns (B, Lq, heads * c), in ``value``'s dtype.

    Sampling runs in float32 whatever the activations' dtype: the locations are coordinates, and
    half-precision ``grid_sample`` (its index arithmetic in the grid's dtype) misplaces samples by
    whole pixels and can return NaN for far-out locations. For float32 inputs the casts are no-ops.
    """
    dtype = value.dtype
    value, locations, weights = value.float(), locations.float(), weights.float()
    b, _, heads, c = value.shape
    lq = locations.shape[1]
    per_level = value.permute(0, 2, 3, 1).flatten(0, 1).split([h * w for h, w in shapes], dim=-1)
    grids = (2.0 * locations - 1.0).permute(0, 2, 1, 3, 4).flatten(0, 1).split(points, dim=-2)
    sampled = [F.grid_sample(v.reshape(b * heads, c, h, w), g, mode="bilinear", padding_mode="zeros",
                             align_corners=False)
               for v, g, (h, w) in zip(per_level, grids, shapes)]          # each (B*heads, c, Lq, p_l)
    w = weights.permute(0, 2, 1, 3).reshape(b * heads, 1, lq, sum(points))
    out = (torch.cat(sampled, -1) * w).sum(-1)                           # (B*heads, c, Lq)
    return out.reshape(b, heads * c, lq).transpose(1, 2).to(dtype)


class MSDeformableAttention(nn.Module):
    """Deformable cross-attention from queries to multi-level memory around reference boxes.

    ``num_points``: one count for every level (RT-DETR) or one per level (RT-DETRv2).
    ``store_points_scale``: keep ``num_points_scale`` in the state dict (RT-DETRv2 layout).
    Checkpoint layout: ``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj``.
    """

    def __init__(self, embed_dim: int = 256, num_heads: int = 8, num_levels: int = 3,
                 num_points: int | list[int] = 4, offset_scale: float = 0.5,
                 store_points_scale: bool = False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        points = [num_points] * num_levels if isinstance(num_points, int) else list(num_points)
        if len(points) != num_levels:
            raise ValueError(f"num_points has {len(points)} entries for {num_levels} levels")
        self.embed_dim, self.num_heads, self.num_levels = embed_dim, num_heads, num_levels
        self.num_points_list = points
        self.offset_scale = offset_scale
        total = sum(points)
        scale = torch.tensor([1.0 / n for n in points for _ in range(n)], dtype=torch.float32)
        self.register_buffer("num_points_scale", scale, persistent=store_points_scale)
        self.sampling_offsets = nn.Linear(embed_dim, num_heads * total * 2)
        self.attention_weights = nn.Linear(embed_dim, num_heads * total)
        self.value_proj = nn.Linear(embed_dim, embed_dim)
        self.output_proj = nn.Linear(embed_dim, embed_dim)
        self._reset_parameters()

    @torch.no_grad()
    def _reset_parameters(self) -> None:
        """The reference initialisation: head h starts sampling along direction 2*pi*h/heads, point
        k of a level at k times the unit step; uniform attention weights; Xavier projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        heads = self.num_heads
        theta = torch.arange(heads, dtype=torch.float32) * (2.0 * math.pi / heads)
        direction = torch.stack((theta.cos(), theta.sin()), -1)
        direction = direction / direction.abs().max(-1, keepdim=True).values          # (heads, 2)
        steps = torch.cat([torch.arange(1, n + 1, dtype=torch.float32) for n in self.num_points_list])
        grid = direction[:, None, :] * steps[None, :, None]                            # (heads, P, 2)
        self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, query: torch.Tensor, ref_boxes: torch.Tensor, value: torch.Tensor,
                shapes: list[tuple[int, int]], value_mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (B, Lq, C); ref_boxes (B, Lq, 1, 4) normalised cxcywh; value (B, Lv, C)."""
        b, lq = query.shape[:2]
        total = sum(self.num_points_list)
        v = self.value_proj(value)
        if value_mask is not None:
            v = v * value_mask.to(v.dtype).unsqueeze(-1)
        v = v.reshape(b, value.shape[1], self.num_heads, self.embed_dim // self.num_heads)
        offsets = self.sampling_offsets(query).reshape(b, lq, self.num_heads, total, 2)
        weights = self.attention_weights(query).reshape(b, lq, self.num_heads, total).softmax(-1)
        # offsets are in units of the box size, scaled down by the number of points per level
        scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)                  # (P, 1)
        locations = (ref_boxes[:, :, None, :, :2]
                     + offsets * scale * ref_boxes[:, :, None, :, 2:] * self.offset_scale)
        out = deformable_sample(v, shapes, locations, weights, self.num_points_list)
        return self.output_proj(out)
