"""YOLO-NAS declarations and its capturable inference stage."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.boxes import clip_to_canvas
from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, REG_MAX, YoloNASNet


class YoloNAS(Model):
    """YOLO-NAS detector (Deci's NAS-found QARepVGG backbone, PAN neck, DFL heads), sizes s, m, l.

    The original pipeline resizes the longer side to 636 and centres the image on a 640 grey
    (114) square; here the shared centred letterbox fills the whole square (the image 0.6 % larger,
    no 2-pixel margin). Input RGB in [0, 1], no normalization.
    """

    FAMILY = "yolonas"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = ("s", "m", "l")
    FILE_PREFIX = "LibreYOLONAS"
    PREPROCESS = Preprocess("center", quantize=True)
    # Both passed on the GPU: the parity protocol and the training-step parity rows
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    #: the QARepVGG blocks add three branches each: verify's re-drawn twin overflows float16
    #: (its AMP probes then give NaN) unless its layers are rescaled on a calibration pass
    REDRAW_CALIBRATE = True
    #: the pose variant (``task="pose"``, ``yolonas-n-pose``) and the oriented-box variant
    #: (``task="obb"``, ``yolonas-s-obb``)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"pose": ".yolonas.pose:YoloNASPose",
                                               "obb": ".yolonas.obb:YoloNASOBB"}
    #: the first 3x3 branch of the stem and the stride-8 head's class conv
    SIGNATURE_KEYS = ("backbone.stem.conv.branch_3x3.conv.weight", "backbone.stem.conv.rbr_reparam.weight",
                      "heads.head1.cls_pred.weight", "heads.head1.reg_pred.weight")
    NC_KEY = "heads.head1.cls_pred.weight"
    #: SuperGradients' YOLO-NAS recipe: AdamW, lr 2e-4, weight decay 1e-5, cosine decay to 0.1
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 2e-4, "weight_decay": 1e-5,
                                                "cos_lr": True, "lrf": 0.1}
    #: the 1 % prior of the class logits (the original initialises them so; a checkpoint's are kept)
    PRIOR_BIAS = (("heads.head1.cls_pred", 0, None), ("heads.head2.cls_pred", 0, None),
                  ("heads.head3.cls_pred", 0, None))

    def calibration_pass(self, g: torch.Generator) -> None:
        """One forward on a random input (``input_sensitive``'s calibration)."""
        s = int(self.imgsz)
        self.infer(torch.rand(1, 3, s, s, generator=g).to(self.device))

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        # the pose and obb variants share every signature key; their ``pose_pred`` / ``rot_pred``
        # convs tell them apart
        return (super()._owns_own(state_dict) and "heads.head1.pose_pred.weight" not in state_dict
                and "heads.head1.rot_pred.weight" not in state_dict)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.SIZES:
            raise ValueError(f"unknown YOLO-NAS size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return YoloNASNet(size, nc)

    def build_loss(self) -> nn.Module:
        """PP-YOLOE's task-aligned VFL + GIoU + DFL loss (the YOLO-NAS recipe)."""
        from .loss import YoloNASLoss
        return YoloNASLoss(self.nc)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB in [0, 1] -> boxes (B, N, 4) xyxy canvas pixels, score (B, N), class (B, N)."""
        (boxes, scores), _ = self.model(x)
        box = clip_to_canvas(boxes.float(), x.shape[-2], x.shape[-1])
        score, cls = scores.float().max(-1)
        return box, score, cls


__all__ = ["CONFIGS", "REG_MAX", "YoloNAS"]
