"""ECPose: the EC family's pose variant (DETR-style keypoint decoder, person keypoints)."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from .model import EC
from .nn import EC_CONFIGS
from .pose_nn import COCO_KEYPOINTS, ECPoseNet


def pose_postprocess(logits: torch.Tensor, kpts: torch.Tensor, width: int, height: int, num_top: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DETR-pose head outputs -> the K best instances, sorted by score descending.

    ``logits`` (B, Q, nc + 1) pre-sigmoid (the first logit is an unused background slot; the
    others score the classes), ``kpts`` (B, Q, 2N) normalised x1, y1, ..., xN, yN. Returns boxes
    (B, K, 4) xyxy (the keypoints' extent), scores (B, K), classes (B, K) int64 and keypoints
    (B, K, N, 2), all in pixels of a ``width`` x ``height`` canvas; K = min(num_top, Q * nc).
    No NMS (set prediction); fixed shapes, no host synchronisation.
    """
    b, q, n1 = logits.shape
    nc = n1 - 1
    k = min(int(num_top), q * nc)
    scores, index = logits[..., 1:].sigmoid().flatten(1).topk(k, dim=1, sorted=True)
    cls = index % nc
    query = index // nc
    pts = kpts.reshape(b, q, -1, 2)
    n = pts.shape[2]
    pts = torch.stack((pts[..., 0] * width, pts[..., 1] * height), -1)      # Python scalars: graph-safe
    picked = pts.gather(1, query[:, :, None, None].expand(-1, -1, n, 2))
    boxes = torch.cat((picked.amin(2), picked.amax(2)), -1)
    return boxes, scores, cls, picked


class ECPose(EC):
    """EdgeCrafter's ECPose: the ECDet backbone and encoder with a DETRPose-style keypoint decoder
    (60 queries, 3 layers, 17 COCO person keypoints; see :mod:`.pose_nn`). Built for ``task="pose"``
    (``LibreYOLO.new("ec", "s", task="pose")``) or from a checkpoint whose ``task`` is ``pose``.

    The network has no per-keypoint visibility output: each keypoint's confidence is its
    instance's score. CUDA-graph support is not declared until the GPU parity protocol has run
    for it (the commands are in docs/families.md).
    """

    TASK = "pose"
    SIZES = ("s",)
    DEFAULT_NC = 1
    NUM_TOP = 60
    SUPPORTS_CUDA_GRAPH = False
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = False
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".ec.model:EC"}
    SIGNATURE_KEYS = ("backbone.backbone.register_token", "backbone.backbone.rope_embed.periods",
                      "decoder.decoder.half_pose_ref_point_head.layers.0.weight",
                      "decoder.enc_pose_embed.layers.0.weight")
    NC_KEY = "decoder.enc_out_class_embed.weight"
    NC_EXTRA_CHANNELS = 1
    #: keypoints per instance of the released checkpoints (COCO's person skeleton)
    NUM_KEYPOINTS = COCO_KEYPOINTS

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        return {0: "person"} if nc == 1 else {i: f"class{i}" for i in range(nc)}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.SIZES:
            raise ValueError(f"unknown EC pose size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return ECPoseNet(EC_CONFIGS[size], nc, cls.NUM_KEYPOINTS)

    def split_outputs(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return out["pred_logits"], out["pred_keypoints"]

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, 3, S, S) preprocessed canvas -> boxes (B, K, 4) xyxy, scores (B, K), classes (B, K)
        and keypoints (B, K, N, 2), in canvas pixels, sorted by score (fixed shapes)."""
        logits, kpts = self.split_outputs(self.model(x))
        return pose_postprocess(logits.float(), kpts.float(), x.shape[-1], x.shape[-2], self.NUM_TOP)

    def build_loss(self) -> nn.Module:
        raise NotImplementedError("training is not implemented for the EC pose variant yet")
