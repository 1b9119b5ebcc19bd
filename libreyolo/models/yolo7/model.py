"""YOLOv7 declarations and its capturable inference stage."""
from __future__ import annotations

import re

import torch
from torch import nn

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
    SIZES = tuple(DESCRIPTIONS)
    FILE_PREFIX = "LibreYOLO7"
    # Set only after the GPU parity protocol passes (see DESIGN.md).
    SUPPORTS_CUDA_GRAPH = False
    DEFAULT_IMGSZ = 640

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

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB in [0, 1] -> boxes (B, N, 4) xyxy in canvas pixels,
        score = objectness * best class probability (B, N), class index (B, N)."""
        pred = self.model.decode(self.model(x)).float()
        cxcy, wh = pred[..., 0:2], pred[..., 2:4]
        boxes = torch.cat((cxcy - 0.5 * wh, cxcy + 0.5 * wh), -1)
        best, cls = pred[..., 5:].max(-1)
        return boxes, pred[..., 4] * best, cls
