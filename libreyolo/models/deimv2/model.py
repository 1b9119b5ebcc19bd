"""DEIMv2 declarations (the inference stage is DetrModel's)."""
from __future__ import annotations

from typing import Any

from torch import nn

from ...ops.preprocess import Preprocess
from ..detr_common.model import IMAGENET, PIL_STRETCH, DetrModel
from .nn import DEIMV2_CONFIGS, DINO_SIZES, DEIMv2Net


class Deimv2(DetrModel):
    """DEIMv2 (Huang et al. 2025, "Real-Time Object Detection Meets DINOv3"), sizes atto, femto,
    pico (three-stage HGNetv2 + lite encoder), n (HGNetv2-B0 + hybrid encoder) and s, m, l, x
    (a DINOv3-derived ViT + the Spatial Tuning Adapter + hybrid encoder, see :mod:`.nn`).

    Input normalisation depends on the size: the HGNetv2 sizes take RGB in [0, 1] (``PIL_STRETCH``); the ViT sizes s-x take ImageNet mean/std (``IMAGENET``, by
    :meth:`preprocess_for`).

    No fixture pins the checkpoint layout of s-x (see :mod:`.nn`): their keys follow the
    upstream module names as read from the reference code, unconfirmed against released weights.
    """

    FAMILY = "deimv2"
    SIZES = tuple(DEIMV2_CONFIGS)
    FILE_PREFIX = "LibreDEIMv2"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    #: the SwiGLU feed-forward and RMSNorm of the decoder layers exist in no other family
    SIGNATURE_KEYS = ("decoder.decoder.layers.0.swish_ffn.w12.weight", "decoder.decoder.layers.0.norm1.scale",
                      "decoder.pre_bbox_head.layers.0.weight")
    NC_KEY = "decoder.dec_score_head.0.weight"
    PREPROCESS = PIL_STRETCH   # PIL's bilinear, as LibreYOLO resizes DEIMv2's input

    def __init__(self, net: nn.Module, *, size: str, imgsz: int | None = None, **kwargs: Any):
        super().__init__(net, size=size, imgsz=imgsz or DEIMV2_CONFIGS[size].input_size, **kwargs)

    @classmethod
    def preprocess_for(cls, size: str) -> Preprocess:
        return IMAGENET if size in DINO_SIZES else PIL_STRETCH   # the ViT sizes were trained on ImageNet statistics

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in DEIMV2_CONFIGS:
            raise ValueError(f"unknown DEIMv2 size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return DEIMv2Net(DEIMV2_CONFIGS[size], nc)
