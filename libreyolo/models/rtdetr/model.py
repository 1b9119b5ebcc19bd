"""RT-DETR declarations (inference stage and post-processing come from DetrModel)."""
from __future__ import annotations

from torch import nn

from ..detr_common.model import DetrModel
from .nn import CONFIGS, build_rtdetr


class RTDETR(DetrModel):
    """RT-DETR (ResNet-vd r18/r34/r50/r101), NMS-free; input RGB in [0, 1], stretched to the square."""

    FAMILY = "rtdetr"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreRTDETR"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # PResNet stem + RT-DETR (v1) encoder-output naming; v2 has enc_output.proj and anchors
    SIGNATURE_KEYS = ("backbone.conv1.conv1_1.conv.weight", "backbone.res_layers.0.blocks.0.branch2a.conv.weight",
                      "encoder.encoder.0.layers.0.self_attn.in_proj_weight", "decoder.enc_output.0.weight")
    NC_KEY = "decoder.enc_score_head.weight"

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return build_rtdetr(size, nc, version=1)
