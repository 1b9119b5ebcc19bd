"""DfineSeg: D-FINE's instance-segmentation variant (task ``segment``)."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..base import Model
from ..detr_common.model import detr_postprocess
from .model import Dfine
from .nn import DFINE_CONFIGS, DFineSegNet


def detr_mask_postprocess(out: dict, width: int, height: int, num_top: int):
    """A DETR segmentation net's eval output -> the K best (query, class) pairs as the segment
    task's ``infer`` tuple: boxes (B, K, 4) xyxy canvas pixels, scores (B, K), classes (B, K),
    each pair's mask embedding (B, K, D) and the mask feature (B, D, H/4, W/4).

    The embedding is the picked query's ``mask_head`` output scaled by ``1/sqrt(D)``, so
    :meth:`DfineSeg.mask_logits` (its dot product with the mask feature) gives the network's
    mask logits. No NMS (set prediction); fixed shapes, no host synchronisation.
    """
    logits = out["pred_logits"].float()
    nc = logits.shape[-1]
    boxes, scores, cls, index = detr_postprocess(logits, out["pred_boxes"].float(), width, height, num_top,
                                                 return_index=True)
    query = index // nc
    embed = out["mask_embed"].float()
    picked = embed.gather(1, query.unsqueeze(-1).expand(-1, -1, embed.shape[-1]))
    return boxes, scores, cls, picked, out["mask_feature"].float()


class DfineSeg(Dfine):
    """D-FINE with a mask head (task ``segment``): the detector's queries each also predict a
    mask, the dot product of a query embedding with a stride-4 mask feature fused from the
    backbone's stride-8 stage and the encoder pyramid (:mod:`..detr_common.mask`).

    Built for ``task="segment"`` (``LibreYOLO.new("dfine", "n", task="segment")``) or from a
    checkpoint whose ``task`` is ``segment`` (or whose keys have the mask head). Trains on the
    segment task's datasets (YOLO-seg polygons, COCO, ``shapes-inst``) with the D-FINE criterion
    plus the mask terms (:class:`~..detr_common.mask_loss.DetrMaskLoss`: BCE and dice of every
    decoder layer's and denoising layer's matched queries, cut to the instance's box, as
    D-FINE-seg does). CUDA-graph predict and the training seam are not declared until their GPU
    runs (docs/families.md gives the commands).
    """

    TASK = "segment"
    #: the size whose layout is pinned by a fixture (the other sizes' mask-head inputs are unverified)
    SIZES = ("n",)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".dfine.model:Dfine"}
    #: the DETR recipe's optimizer settings (the segment task has no mosaic or DETR augmentation policy)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4,
                                                "clip_grad": 0.1}
    # predict's graph passed the GPU parity protocol (docs/families.md); the training seam has not
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = True   # its GPU seam rows passed (docs/families.md)
    SIGNATURE_KEYS = Dfine.SIGNATURE_KEYS + ("decoder.mask_decoder.lateral.0.weight",
                                             "decoder.mask_head.layers.0.weight")

    @classmethod
    def _owns_own(cls, state_dict: dict) -> bool:
        return Model._owns_own.__func__(cls, state_dict)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.SIZES:
            raise ValueError(f"unknown D-FINE segment size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return DFineSegNet(DFINE_CONFIGS[size], nc)

    def split_outputs(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return out["pred_logits"], out["pred_boxes"]

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, 3, S, S) preprocessed canvas -> boxes (B, K, 4) xyxy, scores (B, K), classes (B, K),
        mask embeddings (B, K, D) and the mask feature (B, D, S/4, S/4), sorted by score."""
        return detr_mask_postprocess(self.model(x, with_mask_parts=True), x.shape[-1], x.shape[-2], self.NUM_TOP)

    @staticmethod
    def mask_logits(feature: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """One image's mask feature (D, h, w) and (n, D) scaled embeddings -> (n, h, w) mask logits
        (leading batch dimensions allowed on both: the ONNX graph's batch)."""
        return torch.einsum("...nc,...chw->...nhw", embed, feature)

    def build_loss(self) -> nn.Module:
        """D-FINE's criterion (:meth:`Dfine.build_loss`) plus D-FINE-seg's mask terms."""
        from ..detr_common.mask_loss import DetrMaskLoss
        return DetrMaskLoss(super().build_loss())

    def train_forward(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, gt_masks: torch.Tensor | None = None) -> Any:
        """As the detector's (the boxes feed query denoising); the bitmaps (the segment task's
        third target) are the loss's only. The output carries every set's mask embeddings and
        the mask feature (:class:`~.nn.DFineSegNet`)."""
        return super().train_forward(net, x, targets, mask)

    def train_seam(self, net: nn.Module) -> nn.Module | None:
        """Backbone + encoder + mask decoder (:class:`~.nn.DFineSegFront`): fixed-shape for a
        given image size; the decoder, matcher and losses stay eager (declared: its GPU rows passed,
        docs/families.md)."""
        from .nn import DFineSegFront
        return DFineSegFront(net)
