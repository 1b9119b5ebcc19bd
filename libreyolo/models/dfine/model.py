"""D-FINE declarations (the inference stage is DetrModel's)."""
from __future__ import annotations

from typing import ClassVar

from torch import nn

from ..detr_common.model import PIL_STRETCH, DetrModel
from .nn import DFINE_CONFIGS, DFineNet

#: keys every D-FINE-line checkpoint has and no other family does: HGNetv2 stem, RepNCSPELAN4 FPN,
#: the Linear+LayerNorm before query selection (absent from DEIMv2 / EC), the gated decoder layer
#: and LQE (absent from RT-DETR / RT-DETRv2 / DEIMv2) and the first-layer box head
DFINE_LINE_KEYS = ("backbone.stem.stem1.conv.weight", "encoder.fpn_blocks.0.cv1.conv.weight",
                   "decoder.enc_output.proj.weight", "decoder.decoder.layers.0.gateway.gate.weight",
                   "decoder.decoder.lqe_layers.0.reg_conf.layers.0.weight", "decoder.pre_bbox_head.layers.0.weight")


class Dfine(DetrModel):
    """D-FINE (Peng et al. 2024): RT-DETR with fine-grained distribution refinement, sizes n-x.

    D-FINE, DEIM and RT-DETRv4 checkpoints share every key and shape (they differ only in
    decoder activations), so a bare state dict (no ``model_family`` metadata, no recognisable
    file name) is always read as D-FINE: only this family declares ``SIGNATURE_KEYS``.
    """

    FAMILY = "dfine"
    SIZES = tuple(DFINE_CONFIGS)
    FILE_PREFIX = "LibreDFINE"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    SIGNATURE_KEYS = DFINE_LINE_KEYS
    #: D-FINE-seg serves instance segmentation (the checkpoint's ``task``, else its mask-head keys, picks it)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"segment": ".dfine.seg:DfineSeg"}

    @classmethod
    def _owns_own(cls, state_dict: dict) -> bool:
        """The detector's keys without the mask head (that layout is DfineSeg's)."""
        return super()._owns_own(state_dict) and "decoder.mask_head.layers.0.weight" not in state_dict
    NC_KEY = "decoder.dec_score_head.0.weight"
    CONFIGS = DFINE_CONFIGS
    #: D-FINE and its descendants (DEIM, RT-DETRv4) resize with PIL's bilinear, as LibreYOLO does
    PREPROCESS = PIL_STRETCH

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return DFineNet(cls.CONFIGS[size], nc)
