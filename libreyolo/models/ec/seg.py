"""ECSeg: the EC family's instance-segmentation variant (task ``segment``)."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..base import Model
from ..dfine.seg import detr_mask_postprocess
from .model import EC
from .nn import EC_CONFIGS
from .seg_nn import ECSegNet

#: the mask head's key, which only the segmentation layout has
SEG_HEAD_KEY = "decoder.decoder.segmentation_head.bias"


class ECSeg(EC):
    """EdgeCrafter's ECSeg: ECDet whose queries each also predict a mask, the dot product of a
    query embedding with the encoder's finest map resampled to a fixed 160 x 160 grid over the
    input (:mod:`.seg_nn`).

    Built for ``task="segment"`` (``LibreYOLO.new("ec", "s", task="segment")``, ``ec-s-seg``) or
    from a checkpoint whose ``task`` is ``segment`` (or whose keys have the mask head). Inference
    only: the mask loss is not implemented. CUDA-graph predict is not declared until its GPU run
    (docs/families.md gives the command).
    """

    TASK = "segment"
    #: the size whose layout is pinned by a fixture (the other sizes' mask heads are unverified)
    SIZES = ("s",)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".ec.model:EC", "pose": ".ec.pose:ECPose"}
    # predict's graph passed the GPU parity protocol (docs/families.md); no training (no mask loss yet)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = False
    SIGNATURE_KEYS = EC.SIGNATURE_KEYS + (SEG_HEAD_KEY,
                                          "decoder.decoder.segmentation_head.query_features_proj.weight")

    @classmethod
    def _owns_own(cls, state_dict: dict) -> bool:
        return Model._owns_own.__func__(cls, state_dict)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.SIZES:
            raise ValueError(f"unknown EC segment size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return ECSegNet(EC_CONFIGS[size], nc)

    def split_outputs(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return out["pred_logits"], out["pred_boxes"]

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, 3, S, S) preprocessed canvas -> boxes (B, K, 4) xyxy, scores (B, K), classes (B, K),
        mask embeddings (B, K, D) and the mask feature (B, D, 160, 160) on the fixed grid spanning
        the canvas, sorted by score (fixed shapes)."""
        return detr_mask_postprocess(self.model(x, with_mask_parts=True), x.shape[-1], x.shape[-2], self.NUM_TOP)

    def mask_logits(self, feature: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """One image's mask feature (D, h, w) and (n, D) embeddings -> (n, h, w) mask logits (the
        head's scalar bias added)."""
        bias = self.model.mask_head.bias.to(device=feature.device, dtype=feature.dtype)
        return torch.einsum("nc,chw->nhw", embed.to(feature.dtype), feature) + bias

    def train(self, **kwargs: Any) -> dict:
        raise NotImplementedError("training is not implemented for EC segmentation (inference only: "
                                  "its mask loss is not written)")
