"""RT-DETRv2 network: RT-DETR's backbone/encoder/sizes with the v2 decoder.

The v2 decoder differs in layout only (``enc_output.proj/norm``, stored native-size
``anchors``/``valid_mask``, per-level ``num_points`` with a stored ``num_points_scale``);
everything is built by :func:`libreyolo.models.rtdetr.nn.build_rtdetr`.
"""
from __future__ import annotations

from ..detr_common.net import DetrNet
from ..rtdetr.nn import CONFIGS, build_rtdetr

__all__ = ["CONFIGS", "build_rtdetrv2"]


def build_rtdetrv2(size: str, nc: int) -> DetrNet:
    return build_rtdetr(size, nc, version=2)
