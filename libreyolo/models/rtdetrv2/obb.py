"""RTDETRv2OBB: the RT-DETRv2 family's oriented-box variant (sizes n..x, HGNetv2 backbones)."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from .model import RTDETRv2
from .obb_nn import OBB_CONFIGS, OBB_NATIVE_SIZE, build_rtdetrv2_obb

#: DOTA v1.0's 15 classes (the released checkpoints' label set)
DOTA_NAMES = ("plane", "baseball-diamond", "bridge", "ground-track-field", "small-vehicle", "large-vehicle",
              "ship", "tennis-court", "basketball-court", "storage-tank", "soccer-ball-field", "roundabout",
              "harbor", "swimming-pool", "helicopter")


def obb_postprocess(logits: torch.Tensor, boxes: torch.Tensor, width: int, height: int, num_top: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rotated DETR head outputs -> the K best (query, class) pairs, sorted by score descending.

    ``logits`` (B, Q, nc) pre-sigmoid, ``boxes`` (B, Q, 5) normalised cx, cy, w, h and angle / pi.
    Returns xywhr (B, K, 5) in pixels of a ``width`` x ``height`` canvas with the angle in radians,
    scores (B, K) and classes (B, K) int64; K = min(num_top, Q * nc). No NMS (set prediction); fixed
    shapes, no host synchronisation.
    """
    _, q, nc = logits.shape
    k = min(int(num_top), q * nc)
    scores, index = logits.sigmoid().flatten(1).topk(k, dim=1, sorted=True)
    cls = index % nc
    query = index // nc
    # Python scalars: no host->device copy inside a graph capture
    xywhr = torch.stack((boxes[..., 0] * width, boxes[..., 1] * height, boxes[..., 2] * width,
                         boxes[..., 3] * height, boxes[..., 4] * math.pi), -1)
    return xywhr.gather(1, query.unsqueeze(-1).expand(-1, -1, 5)), scores, cls


class RTDETRv2OBB(RTDETRv2):
    """RT-DETRv2 for oriented boxes (:mod:`.obb_nn`), as released for DOTA (sizes n, s, m, l, x).
    Built for ``task="obb"`` (``LibreYOLO.new("rtdetrv2", "n", task="obb")``, ``rtdetrv2-n-obb``) or
    from a checkpoint whose ``task`` is ``obb`` (or whose layout is this one).

    Input: RGB in [0, 1], no normalization, letterboxed to the top-left corner and padded with
    black (the released models' convention; they were trained at 1024). Predict: the network, then a top-k over
    queries x classes (no NMS), boxes as centre, size and angle in canvas pixels. Predict runs in
    a CUDA graph; the training seam is not declared until its GPU run (docs/families.md).
    """

    TASK = "obb"
    SIZES = tuple(OBB_CONFIGS)
    DEFAULT_NC = len(DOTA_NAMES)
    DEFAULT_IMGSZ = OBB_NATIVE_SIZE
    #: PIL's bilinear resize into a black-padded top-left letterbox, as the reference predicts
    PREPROCESS: ClassVar[Preprocess] = Preprocess("topleft", antialias=True, quantize=True, pad=0.0)
    # predict's graph passed the GPU parity protocol; the training seam has had no GPU run yet
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = False
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".rtdetrv2.model:RTDETRv2"}
    #: the DETR recipe's optimizer settings (the obb task has no mosaic or DETR augmentation policy)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4,
                                                "clip_grad": 0.1}
    # HGNetv2 stem + the identity branch of the encoder's RepVGG blocks + the v2 decoder layout
    SIGNATURE_KEYS = ("backbone.stem.stem1.conv.weight", "encoder.fpn_blocks.0.bottlenecks.0.identity.weight",
                      "decoder.enc_output.proj.weight", "decoder.decoder.layers.0.cross_attn.num_points_scale",
                      "decoder.query_pos_head.layers.0.weight")
    NC_KEY = "decoder.enc_score_head.weight"

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        return dict(enumerate(DOTA_NAMES)) if nc == len(DOTA_NAMES) else {i: f"class{i}" for i in range(nc)}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return build_rtdetrv2_obb(size, nc)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) preprocessed canvas -> xywhr (B, K, 5) canvas pixels (angle in radians),
        scores (B, K), classes (B, K), sorted by score (fixed shapes)."""
        logits, boxes = self.split_outputs(self.model(x))
        return obb_postprocess(logits.float(), boxes.float(), x.shape[-1], x.shape[-2], self.NUM_TOP)

    def build_loss(self) -> nn.Module:
        """The rotated set criterion (:class:`~..detr_common.obb_loss.RotatedSetLoss`)."""
        from ..detr_common.obb_loss import RotatedSetLoss
        return RotatedSetLoss(self.nc)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """Training-mode forward (no query denoising): every layer's outputs and the selected
        encoder proposals (see :class:`~.obb_nn.OBBDecoder`)."""
        return net(x)
