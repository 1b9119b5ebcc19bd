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
    instance's score. Predict runs in a CUDA graph; training capture is not declared until its
    GPU run (docs/families.md).
    """

    TASK = "pose"
    SIZES = ("s",)
    DEFAULT_NC = 1
    NUM_TOP = 60
    # predict's graph passed the GPU parity protocol; the training capture has had no GPU run yet
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM = False
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".ec.model:EC", "segment": ".ec.seg:ECSeg"}
    #: the DETR recipe's optimizer settings (the pose task has no mosaic or DETR augmentation policy)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4,
                                                "clip_grad": 0.1}
    SIGNATURE_KEYS = ("backbone.backbone.register_token", "backbone.backbone.rope_embed.periods",
                      "decoder.decoder.half_pose_ref_point_head.layers.0.weight",
                      "decoder.enc_pose_embed.layers.0.weight")
    NC_KEY = "decoder.enc_out_class_embed.weight"
    NC_EXTRA_CHANNELS = 1
    #: keypoints per instance of the released checkpoints (COCO's person skeleton)
    NUM_KEYPOINTS = COCO_KEYPOINTS

    def __init__(self, net: nn.Module, **kwargs: Any):
        super().__init__(net, **kwargs)
        self.num_keypoints = int(net.decoder.num_keypoints)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, **kwargs: Any) -> ECPose:
        """A checkpoint of any keypoint count (its ``keypoint_embedding`` rows)."""
        emb = ckpt["model"].get("decoder.keypoint_embedding.weight")
        k = int(emb.shape[0]) if emb is not None else cls.NUM_KEYPOINTS
        if k != cls.NUM_KEYPOINTS:
            variant = type(cls.__name__, (cls,), {"NUM_KEYPOINTS": k, "__module__": cls.__module__,
                                                  "__doc__": cls.__doc__})
            return variant.from_checkpoint(ckpt, **kwargs)
        return super().from_checkpoint(ckpt, **kwargs)

    def reset_keypoints(self, num_keypoints: int) -> None:
        """Rebuild the network for ``num_keypoints`` keypoints per instance, keeping every weight
        whose shape still fits (the keypoint-count-dependent layers start untrained)."""
        new = ECPoseNet(EC_CONFIGS[self.size], self.nc, int(num_keypoints))
        old, fresh = self.model.state_dict(), new.state_dict()
        new.load_state_dict({k: v for k, v in old.items() if k in fresh and fresh[k].shape == v.shape}, strict=False)
        new.train(self.model.training)   # a fresh module is in training mode; keep the old one's
        self._attach(new.to(self.device))
        self.num_keypoints = int(num_keypoints)

    def reset_classes(self, nc: int, names: Any = None) -> None:
        """As :meth:`Model.reset_classes`, keeping this model's keypoint count."""
        k = self.num_keypoints
        super().reset_classes(nc, names)
        if k != self.NUM_KEYPOINTS:
            self.reset_keypoints(k)

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

    def sigmas(self) -> tuple[float, ...]:
        """The OKS sigmas of this model's keypoints: the training dataset's (metadata ``kpt_sigmas``),
        else COCO's for 17 keypoints, else 0.05 each."""
        from ...tasks.pose.results import COCO_SIGMAS
        given = self.meta.get("kpt_sigmas")
        if given is not None and len(given) == self.num_keypoints:
            return tuple(float(v) for v in given)
        return COCO_SIGMAS if self.num_keypoints == 17 else (0.05,) * self.num_keypoints

    def build_loss(self) -> nn.Module:
        """The DETRPose-style set criterion (:class:`.pose_loss.PoseSetLoss`)."""
        from .pose_loss import PoseSetLoss
        return PoseSetLoss(self.nc, self.sigmas())

    def train_seam(self, net: nn.Module) -> nn.Module | None:
        return None

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """Training-mode forward (no query denoising): every layer's, the initial keypoints' and
        the encoder proposals' outputs (see :mod:`.pose_nn`)."""
        return net(x)
