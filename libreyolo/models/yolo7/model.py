"""YOLOv7 declarations and its capturable inference stage."""
from __future__ import annotations

import re

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .nn import DESCRIPTIONS, Yolo7Net

# Only this layout has the implicit-knowledge head: ``layers.<n>.heads.<l>.implicit_a``
# (n = 105 for size b, 77 for tiny) next to a flat, numbered ``layers.<i>`` graph.
_HEAD = re.compile(r"^layers\.(\d+)\.heads\.0\.head_conv\.weight$")


def _head_index(state_dict) -> int | None:
    for k in state_dict:
        m = _HEAD.match(k)
        if m and f"layers.{m.group(1)}.heads.0.implicit_a.implicit" in state_dict:
            return int(m.group(1))
    return None


class Yolo7(Model):
    """YOLOv7 detector in the LibreYOLO layout.

    Sizes: b (LibreYOLO's only size; checkpoint ``LibreYOLO7b.pt``) and tiny (the original
    YOLOv7-tiny graph, LeakyReLU 0.1, in the same flat ``layers.<i>`` layout; LibreYOLO
    publishes no tiny checkpoint). Input: letterboxed RGB in [0, 1], no mean/std.
    """

    FAMILY = "yolo7"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = tuple(DESCRIPTIONS)
    FILE_PREFIX = "LibreYOLO7"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # Declared after the GPU training parity passed (step-0 loss and BatchNorm buffers bitwise, 20-step
    # curves within eager noise; forward+backward and whole step): see docs/families.md.
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    DEFAULT_IMGSZ = 640
    #: letterboxed at the top-left with PIL's bilinear (antialiased when shrinking), as LibreYOLO does
    PREPROCESS = Preprocess("topleft", antialias=True, quantize=True)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return Yolo7Net(size, nc)

    @classmethod
    def owns_state_dict(cls, state_dict) -> bool:
        return _head_index(state_dict) is not None and "layers.0.conv.weight" in state_dict

    @classmethod
    def nc_from_state_dict(cls, state_dict) -> int | None:
        n = _head_index(state_dict)
        w = None if n is None else state_dict[f"layers.{n}.heads.0.head_conv.weight"]
        if w is None or w.shape[0] % 3 or w.shape[0] // 3 <= 5:
            return None
        return int(w.shape[0]) // 3 - 5

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """Objectness and class biases to logit(prior) (the original Detect init)."""
        net.initialize_biases(prior)
        return len(net.layers[-1].heads)

    def build_loss(self) -> nn.Module:
        """YOLOv7's OTA loss with the gains of this size's hyp file, scaled for ``self.imgsz``."""
        from .loss import HYPERPARAMETERS, Yolo7Loss
        return Yolo7Loss(self.nc, imgsz=self.imgsz, **HYPERPARAMETERS[self.size])

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB in [0, 1] -> boxes (B, N, 4) xyxy in canvas pixels,
        score = objectness * best class probability (B, N), class index (B, N)."""
        return self.model.decode(self.model(x))
