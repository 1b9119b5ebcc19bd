"""SwinIR declarations (restore task, 4x super-resolution)."""
from __future__ import annotations

from torch import nn

from ...tasks.restore.family import RestoreFamily
from .nn import CONFIGS, SCALE, WINDOW, SwinIRNet


class SwinIR(RestoreFamily):
    """SwinIR x4, sizes s (lightweight, 60 channels, pixelshuffledirect), m (real-world SwinIR-M,
    180 channels) and l (real-world SwinIR-L, 240 channels, 9 RSTBs), task ``restore``
    (:mod:`.nn`). Predict's tiles are multiples of the 8 px attention window (``STRIDE``)."""

    FAMILY = "swinir"
    SUPPORTS_CUDA_GRAPH = True   # proven on a GPU: docs/families.md (session 31's rows, benchmarks/results/session31/)
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreSwinIR"   # the LibreYOLO checkpoint names: LibreSwinIRs-restore.pt, ...
    DEFAULT_IMGSZ = 64
    STRIDE = WINDOW
    SCALE_BY_SIZE = {size: SCALE for size in CONFIGS}
    SIGNATURE_KEYS = ("conv_first.weight", "patch_embed.norm.weight", "conv_after_body.weight",
                      "layers.0.residual_group.blocks.0.attn.relative_position_bias_table")

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return SwinIRNet(size)
