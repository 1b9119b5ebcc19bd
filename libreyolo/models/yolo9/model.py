"""YOLOv9 declarations and its capturable inference stage."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import CONFIGS, Yolo9Net


class Yolo9(Model):
    """YOLOv9 (GELAN) detector, sizes t, s, m, c."""

    FAMILY = "yolo9"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreYOLO9"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # Declared after the GPU training parity passed (step-0 loss and BatchNorm buffers bitwise, 20-step
    # curves within eager noise; forward+backward and whole step): see docs/families.md.
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    #: letterboxed (top-left unless a checkpoint's ``letterbox_pad`` says centre) with OpenCV's
    #: INTER_LINEAR on uint8 pixels, as LibreYOLO does: no antialiasing, whole levels
    PREPROCESS = Preprocess("topleft", quantize=True)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return Yolo9Net(size, nc)

    SIGNATURE_KEYS = ("backbone.elan1.cv1.conv.weight", "neck.elan_down2.cv4.conv.weight", "head.cv3.0.2.weight")
    NC_KEY = "head.cv3.0.2.weight"
    #: keys that only the YOLOv9 variants' layouts have (P2's stride-4 neck block, E2E's one-to-one
    #: head): their state dicts hold every YOLOv9 key as well, so these tell them apart
    VARIANT_KEYS: tuple[str, ...] = ("neck.elan_up3.cv4.conv.weight", "head.one2one_cv3.0.2.weight")

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        return super()._owns_own(state_dict) and not any(k in state_dict for k in cls.VARIANT_KEYS)

    def build_loss(self) -> nn.Module:
        from .loss import Yolo9Loss
        return Yolo9Loss(self.nc)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) -> boxes (B, N, 4) xyxy in canvas pixels, best score (B, N), class (B, N)."""
        pred = self.model(x)["predictions"].float()
        boxes = pred[:, :4].transpose(1, 2)
        scores, cls = pred[:, 4:].max(1)
        return boxes, scores, cls

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        """The eval pass already holds the training-format maps (``raw_outputs``): no second pass."""
        return out["raw_outputs"]
