"""RT-DETR network configs: ResNet-vd backbone, hybrid encoder, RT-DETR decoder.

All blocks live in :mod:`libreyolo.models.detr_common`; this file only holds the per-size
settings (from the original RT-DETR configs) and the builder shared with RT-DETRv2.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..detr_common.hybrid_encoder import HybridEncoder
from ..detr_common.net import DetrNet
from ..detr_common.presnet import PResNet
from ..detr_common.rtdetr_decoder import RTDETRDecoder


@dataclass(frozen=True)
class RTDETRConfig:
    depth: int                 # ResNet-vd depth
    hidden_dim: int            # encoder width (and decoder input width)
    enc_ff: int                # AIFI feed-forward width
    expansion: float           # CSPRepLayer width expansion
    dec_layers: int            # decoder layers


CONFIGS: dict[str, RTDETRConfig] = {
    "r18": RTDETRConfig(18, 256, 1024, 0.5, 3),
    "r34": RTDETRConfig(34, 256, 1024, 0.5, 4),
    "r50": RTDETRConfig(50, 256, 1024, 1.0, 6),
    "r101": RTDETRConfig(101, 384, 2048, 1.0, 6),
}

NATIVE_SIZE = 640  # the training resolution (RT-DETRv2 stores anchors for it)


def build_rtdetr(size: str, nc: int, version: int = 1) -> DetrNet:
    """RT-DETR (``version=1``) or RT-DETRv2 (``version=2``, same widths, v2 decoder layout)."""
    cfg = CONFIGS[size]
    backbone = PResNet(cfg.depth)
    encoder = HybridEncoder(backbone.out_channels, cfg.hidden_dim, dim_feedforward=cfg.enc_ff,
                            expansion=cfg.expansion)
    decoder = RTDETRDecoder(nc, 256, feat_channels=[cfg.hidden_dim] * 3, num_layers=cfg.dec_layers,
                            num_points=[4, 4, 4] if version == 2 else 4, version=version,
                            native_size=(NATIVE_SIZE, NATIVE_SIZE))
    return DetrNet(backbone, encoder, decoder)
