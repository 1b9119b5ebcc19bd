"""ECDet declarations (the inference stage is DetrModel's)."""
from __future__ import annotations

from typing import ClassVar

from torch import nn

from ..detr_common.model import IMAGENET, DetrModel
from .nn import EC_CONFIGS, INPUT_SIZE, ECNet


class EC(DetrModel):
    """EdgeCrafter's ECDet (compact ViT + FDR decoder), sizes s, m, l, x.

    The backbone expects ImageNet mean/std normalisation (``PREPROCESS = IMAGENET``, applied by
    the engine before the network); ``model.model`` itself takes the normalised tensor.
    """

    FAMILY = "ec"
    SIZES = tuple(EC_CONFIGS)
    FILE_PREFIX = "LibreEC"
    PREPROCESS = IMAGENET
    DEFAULT_IMGSZ = INPUT_SIZE
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    #: the ViT's register token and rotary periods and the decoder layers' ``norm2``-named output norm
    SIGNATURE_KEYS = ("backbone.backbone.register_token", "backbone.backbone.rope_embed.periods",
                      "backbone.projector.0.conv.weight", "decoder.decoder.layers.0.norm2.weight",
                      "decoder.pre_bbox_head.layers.0.weight")
    NC_KEY = "decoder.dec_score_head.0.weight"
    #: the pose variant (``task="pose"``): :class:`.pose.ECPose`; the segmentation variant
    #: (``task="segment"``): :class:`.seg.ECSeg`
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"pose": ".ec.pose:ECPose", "segment": ".ec.seg:ECSeg"}

    @classmethod
    def _owns_own(cls, state_dict: dict) -> bool:
        """The detector's keys without the mask head (that layout is ECSeg's)."""
        return super()._owns_own(state_dict) and "decoder.decoder.segmentation_head.bias" not in state_dict

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in EC_CONFIGS:
            raise ValueError(f"unknown EC size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return ECNet(EC_CONFIGS[size], nc)
