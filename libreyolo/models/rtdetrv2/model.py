"""RT-DETRv2 declarations (inference stage and post-processing come from DetrModel)."""
from __future__ import annotations

from typing import ClassVar

from torch import nn

from ..detr_common.model import DetrModel
from .nn import CONFIGS, build_rtdetrv2


class RTDETRv2(DetrModel):
    """RT-DETRv2 (ResNet-vd r18/r34/r50/r101), NMS-free; input RGB in [0, 1], stretched to the square."""

    FAMILY = "rtdetrv2"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreRTDETRv2"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # PResNet stem + the v2 decoder layout (D-FINE/DEIM share the decoder keys, not the backbone)
    SIGNATURE_KEYS = ("backbone.conv1.conv1_1.conv.weight", "backbone.res_layers.0.blocks.0.branch2a.conv.weight",
                      "decoder.enc_output.proj.weight", "decoder.anchors",
                      "decoder.decoder.layers.0.cross_attn.num_points_scale")
    NC_KEY = "decoder.enc_score_head.weight"
    #: the oriented-box variant (``task="obb"``, sizes n..x): :class:`.obb.RTDETRv2OBB`
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"obb": ".rtdetrv2.obb:RTDETRv2OBB"}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return build_rtdetrv2(size, nc)
