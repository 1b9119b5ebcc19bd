"""Transformer pieces shared by several families (checkpoint names are part of their layouts)."""
from __future__ import annotations

import torch
from torch import nn


class GeluMlp(nn.Module):
    """The transformer feed-forward ``fc2(GELU(fc1(x)))`` (exact GELU): BiRefNet's Swin blocks and
    EC's ViT blocks. Checkpoint names ``fc1`` / ``fc2`` (``act`` holds no weights)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
