"""The family class shared by YOLOv2, YOLOv3 and YOLOv4 (each subclass names its cfgs)."""
from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from .cfgs import DarknetCfg
from .nn import DarknetDetector


def anchors_per_head(cfg: DarknetCfg) -> int:
    """How many anchors each head of ``cfg`` predicts (every head of a Darknet cfg has as many)."""
    for layer in cfg.layers:
        if layer[0] == "yolo":
            return len(layer[1])
    return len(cfg.anchors)


class DarknetModel(Model):
    """A Darknet detector family (YOLOv2 / v3 / v4) in the LibreYOLO layout.

    Input: RGB in [0, 1], letterboxed at the top-left onto a square canvas padded with grey 128
    (the reference's convention, read from its fixtures; Darknet itself centres the image), no
    mean/std. Predict: the heads decoded (:meth:`DarknetDetector.decode`), score = objectness x
    best class probability, then the shared top-k and NMS of the detect task.
    """

    TASK = "detect"
    CHANNELS_LAST = True
    # Declared per family once a GPU run proves it (YOLOv3 and v4 so far: docs/families.md).
    SUPPORTS_CUDA_GRAPH = False
    SUPPORTS_CUDA_GRAPH_TRAIN = False
    DEFAULT_IMGSZ = 416
    PREPROCESS = Preprocess("topleft", pad=128.0)
    #: size -> its Darknet cfg
    CFGS: ClassVar[dict[str, DarknetCfg]] = {}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.CFGS:
            raise ValueError(f"unknown {cls.FAMILY} size {size!r}; choose one of {sorted(cls.CFGS)}")
        return DarknetDetector(cls.FAMILY, cls.CFGS[size], nc)

    @classmethod
    def _head_bias(cls) -> re.Pattern:
        return re.compile(rf"^{re.escape(cls.FAMILY)}\.layers\.(\d+)\.conv\.bias$")

    @classmethod
    def _owns_own(cls, state_dict) -> bool:
        """``<family>.layers.0.conv.weight`` and a head conv's bias (the layout of this family)."""
        pattern = cls._head_bias()
        return f"{cls.FAMILY}.layers.0.conv.weight" in state_dict and any(pattern.match(k) for k in state_dict)

    @classmethod
    def nc_from_state_dict(cls, state_dict) -> int | None:
        na = anchors_per_head(next(iter(cls.CFGS.values())))
        pattern = cls._head_bias()
        for k, v in state_dict.items():
            if pattern.match(k):
                c = int(v.shape[0])
                return c // na - 5 if c % na == 0 and c // na > 5 else None
        return None

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """Objectness (and sigmoid class) biases to logit(prior), as the other YOLO recipes start."""
        return net.initialize_biases(prior)

    def build_loss(self) -> nn.Module:
        """The classic loss of this size's cfg (``[region]`` or ``[yolo]``)."""
        from .loss import DarknetLoss
        net = self.model
        return DarknetLoss(net.heads, net.cfg, self.nc)

    def train_defaults(self) -> dict[str, Any]:
        """The cfg's ``[net]`` optimizer: SGD with its momentum and its learning rate in the
        trainer's units (the loss is Darknet's per-image sum over 640, see ``loss.py``: Darknet's
        ``learning_rate`` x 10 gives Darknet's step at the nominal batch of 64)."""
        from .loss import DARKNET_STEP_NORMALIZER
        cfg = self.CFGS[self.size]
        lr0 = cfg.learning_rate * DARKNET_STEP_NORMALIZER / 64
        return {**self.TRAIN_DEFAULTS, "optimizer": "SGD", "lr0": lr0, "momentum": cfg.momentum}

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB in [0, 1] -> boxes (B, N, 4) xyxy in canvas pixels, score =
        objectness x best class probability (B, N), class index (B, N)."""
        return self.model.decode(self.model(x))
