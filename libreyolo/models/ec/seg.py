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
    from a checkpoint whose ``task`` is ``segment`` (or whose keys have the mask head). Trains on
    the segment task's datasets (YOLO-seg polygons, COCO, ``shapes-inst``) with the D-FINE
    criterion plus the mask terms (:class:`~..detr_common.mask_loss.DetrMaskLoss`: BCE and dice of
    every decoder layer's and denoising layer's matched queries on the 160 x 160 grid, cut to the
    instance's box), each layer's mask made with its own number of head blocks as in the original.
    The training seam (:meth:`train_seam`) is not declared until its GPU rows pass
    (docs/families.md gives the command).
    """

    TASK = "segment"
    #: the size whose layout is pinned by a fixture (the other sizes' mask heads are unverified)
    SIZES = ("s",)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".ec.model:EC", "pose": ".ec.pose:ECPose"}
    #: the DETR recipe's optimizer settings (the segment task has no mosaic or DETR augmentation policy)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4,
                                                "clip_grad": 0.1}
    # predict's graph passed the GPU parity protocol (docs/families.md); the training seam has not
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

    def build_loss(self) -> nn.Module:
        """EC's detection criterion (D-FINE's: :meth:`~..detr_common.model.DetrModel.build_loss`)
        plus the mask terms, with their default weights (BCE 1, dice 1) and box crop."""
        from ..detr_common.mask_loss import DetrMaskLoss
        return DetrMaskLoss(super().build_loss())

    def train_forward(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, gt_masks: torch.Tensor | None = None) -> Any:
        """As the detector's (the boxes feed query denoising); the bitmaps (the segment task's
        third target) are the loss's only. The output carries every layer's mask factors
        (:class:`~.seg_nn.ECSegNet`)."""
        return super().train_forward(net, x, targets, mask)

    def train_seam(self, net: nn.Module) -> nn.Module | None:
        """Backbone + encoder + the mask head's spatial side (:class:`~.seg_nn.ECSegFront`):
        fixed-shape for a given image size; the decoder, the query side of the head, the matcher
        and the losses stay eager. Not declared (``SUPPORTS_CUDA_GRAPH_TRAIN_SEAM`` is False)
        until its GPU rows pass (docs/families.md)."""
        from .seg_nn import ECSegFront
        return ECSegFront(net)
