"""YOLO-NAS-Pose: the YOLO-NAS family's pose variant (dense heads, per-keypoint visibility)."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.boxes import clip_to_canvas
from ...ops.nms import nan_last
from ...ops.preprocess import Preprocess
from .model import YoloNAS
from .pose_nn import COCO_KEYPOINTS, POSE_HEAD_WIDTH, YoloNASPoseNet

#: candidates kept (by score) before NMS, as the original post-processing does
PRE_NMS_TOP_K = 1000


class YoloNASPose(YoloNAS):
    """YOLO-NAS-Pose (sizes n, s, m, l): the detector's backbone and neck with pose heads that
    predict, per anchor, a person box, 17 COCO keypoints and each keypoint's visibility. Built for
    ``task="pose"`` (``LibreYOLO.new("yolonas", "n", task="pose")``, ``yolonas-n-pose``) or from a
    checkpoint whose ``task`` is ``pose``.

    Preprocessing as the original: BGR (channels reversed inside :meth:`infer` and
    :meth:`train_forward`) in [0, 1], the image at the top-left of the square. The original pads
    with grey 127; the shared letterbox pads with 114.
    """

    TASK = "pose"
    # predict's graph passed the GPU parity protocol (as the detector's), the pose loss's training
    # rows too (docs/families.md)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    SIZES = tuple(POSE_HEAD_WIDTH)
    DEFAULT_NC = 1
    PREPROCESS = Preprocess("topleft", quantize=True)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".yolonas.model:YoloNAS",
                                               "obb": ".yolonas.obb:YoloNASOBB"}
    SIGNATURE_KEYS = ("backbone.stem.conv.branch_3x3.conv.weight", "backbone.stem.conv.rbr_reparam.weight",
                      "heads.head1.pose_pred.weight", "heads.head1.pose_stem.seq.conv.weight")
    NC_KEY = "heads.head1.cls_pred.weight"
    #: keypoints per instance of the released checkpoints (COCO's person skeleton)
    NUM_KEYPOINTS = COCO_KEYPOINTS
    NUM_TOP = PRE_NMS_TOP_K
    #: SuperGradients' YOLO-NAS-Pose recipe (``coco2017_yolo_nas_pose_train_params``), not the
    #: detector's: AdamW, lr 1e-3 - half the recipe's 2e-3, which is set for its larger batches: at
    #: batch 16 1e-3 trained better than 2e-3 on every seed compared (docs/benchmarks.md, "Task
    #: variants: quality"), and the detector's 2e-4 left the pose heads untrained in a short run -,
    #: weight decay 1e-6, cosine decay to 0.05, a warm-up that ramps every group from 0 as the
    #: original's does (the engine's bias warm-up from 0.1 is an SGD value: under AdamW it moves
    #: every bias by about 0.1 a step), and a step every batch of 16 (the recipe accumulates no
    #: gradients; the engine's nominal batch of 64 would make 4 batches one step)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-3, "weight_decay": 1e-6,
                                                "cos_lr": True, "lrf": 0.05, "warmup_bias_lr": 0.0, "nbs": 16}
    #: the keypoint branch's gradient scale into the neck while training (the pose task's
    #: ``kpt_grad`` overrides it; 1: the original's, unscaled)
    KPT_GRAD: ClassVar[float] = 1.0

    def __init__(self, net: nn.Module, **kwargs: Any):
        super().__init__(net, **kwargs)
        self.num_keypoints = int(net.num_keypoints)

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        return bool(cls.SIGNATURE_KEYS) and all(k in state_dict for k in cls.SIGNATURE_KEYS)

    @classmethod
    def nc_from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> int | None:
        """The class rows of ``cls_pred`` less one visibility row per keypoint (``pose_pred`` / 2)."""
        w, p = state_dict.get(cls.NC_KEY), state_dict.get("heads.head1.pose_pred.weight")
        if w is None or p is None:
            return None
        nc = int(w.shape[0]) - int(p.shape[0]) // 2
        return nc if nc > 0 else None

    @classmethod
    def from_checkpoint(cls, ckpt: dict, **kwargs: Any) -> YoloNASPose:
        """A checkpoint of any keypoint count (its ``pose_pred`` rows / 2)."""
        p = ckpt["model"].get("heads.head1.pose_pred.weight")
        k = int(p.shape[0]) // 2 if p is not None else cls.NUM_KEYPOINTS
        if k != cls.NUM_KEYPOINTS:
            variant = type(cls.__name__, (cls,), {"NUM_KEYPOINTS": k, "__module__": cls.__module__,
                                                  "__doc__": cls.__doc__})
            return variant.from_checkpoint(ckpt, **kwargs)
        return super().from_checkpoint(ckpt, **kwargs)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.SIZES:
            raise ValueError(f"unknown YOLO-NAS pose size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return YoloNASPoseNet(size, nc, cls.NUM_KEYPOINTS)

    def reset_keypoints(self, num_keypoints: int) -> None:
        """Rebuild the network for ``num_keypoints`` keypoints per instance, keeping every weight
        whose shape still fits (``cls_pred`` and ``pose_pred`` start untrained)."""
        new = YoloNASPoseNet(self.size, self.nc, int(num_keypoints))
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

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """The class logits at the detector's 1 % prior; each ``cls_pred``'s visibility rows (after
        the classes) at 0, probability 0.5 (as :class:`.pose_nn.PoseDFLHead` builds them): most
        keypoints of an instance are labelled, so a rare-positive prior there starts the
        visibility loss far from its targets, pulling on the convolutions the class logits share
        (paired by seed on the CPU it raised OKS mAP50 on most seeds: docs/benchmarks.md)."""
        heads = [f"heads.head{i}.cls_pred" for i in (1, 2, 3)]
        return (self._prior_bias(net, tuple((h, 0, self.nc) for h in heads), prior)
                + self._prior_bias(net, tuple((h, self.nc, None) for h in heads), 0.5))

    def set_keypoint_gradient(self, net: nn.Module, scale: float | None = None) -> None:
        """Each level's keypoint branch passes ``scale`` times its gradient into the neck while
        training (:class:`.pose_nn.PoseDFLHead`; None: :attr:`KPT_GRAD`)."""
        value = float(self.KPT_GRAD if scale is None else scale)
        for mod in net.modules():
            if hasattr(mod, "kpt_grad"):
                mod.kpt_grad = value

    def sigmas(self) -> tuple[float, ...]:
        """The OKS sigmas of this model's keypoints: the training dataset's (metadata ``kpt_sigmas``),
        else COCO's for 17 keypoints, else 0.05 each."""
        from ...tasks.pose.results import COCO_SIGMAS
        given = self.meta.get("kpt_sigmas")
        if given is not None and len(given) == self.num_keypoints:
            return tuple(float(v) for v in given)
        return COCO_SIGMAS if self.num_keypoints == 17 else (0.05,) * self.num_keypoints

    def build_loss(self) -> nn.Module:
        """YOLO-NAS-Pose's loss (:class:`.pose_loss.YoloNASPoseLoss`)."""
        from .pose_loss import YoloNASPoseLoss
        return YoloNASPoseLoss(self.nc, self.sigmas())

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """The network's outputs on the BGR input, with the input's (height, width) (the loss
        scales the normalized targets to pixels)."""
        return net(x.flip(1)), (int(x.shape[-2]), int(x.shape[-1]))

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        return out, (int(x.shape[-2]), int(x.shape[-1]))

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, 3, S, S) RGB canvas -> the ``NUM_TOP`` best candidates by score (fixed shapes):
        boxes (B, K, 4) xyxy, scores (B, K), classes (B, K), keypoints (B, K, N, 2) in canvas pixels
        and their visibility (B, K, N); the pose task's NMS picks among them."""
        (boxes, scores, kpts, vis), _ = self.model(x.flip(1))
        boxes = clip_to_canvas(boxes.float(), x.shape[-2], x.shape[-1])
        score, cls = scores.float().max(-1)
        k = min(self.NUM_TOP, score.shape[1])
        # NaN scores ranked last (-inf), as detection's candidates: the in-stage NMS walk reads the
        # candidates above conf as a prefix of each row and would stop at a NaN at its head
        score, idx = nan_last(score).topk(k, dim=1, sorted=True)
        n = kpts.shape[2]
        return (boxes.gather(1, idx[..., None].expand(-1, -1, 4)), score, cls.gather(1, idx),
                kpts.float().gather(1, idx[..., None, None].expand(-1, -1, n, 2)),
                vis.float().gather(1, idx[..., None].expand(-1, -1, n)))
