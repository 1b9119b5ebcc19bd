"""What the restoration families share (NAFNet, Real-ESRGAN, SwinIR): the family base class.

A restoration network takes RGB in [0, 1] at any size (the family's ``STRIDE`` divides the tiles
predict feeds it) and returns the restored RGB, ``scale`` times larger (1 for NAFNet, 2 or 4 for
the super-resolution families), not yet clamped. The model holds one output "class" named
``image`` (LibreYOLO 1.6.0's ``nc``/``names`` of these checkpoints).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ...models.base import Model
from ...ops.preprocess import Preprocess


class RestoreFamily(Model):
    """Base of the ``restore`` families (see the module docstring).

    Predict cuts each image into tiles of ``imgsz`` x ``imgsz`` pixels (the restore task's plan):
    the network's input is a tile at the image's own resolution, so ``PREPROCESS`` resizes nothing
    there; training and validation crop patches of ``imgsz`` pixels from the paired images and the
    batches reach the network as RGB in [0, 1] (no mean/std: the networks normalize themselves).
    """

    TASK = "restore"
    DEFAULT_NC = 1
    #: output pixels per input pixel, per size (1 where a size is missing)
    SCALE_BY_SIZE: ClassVar[dict[str, int]] = {}
    PREPROCESS = Preprocess("stretch")
    #: Adam-style restoration recipe: AdamW without weight decay, cosine decay, no warm-up, the
    #: nominal batch equal to the batch (the loss is a per-pixel mean: see :meth:`train`)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "AdamW", "lr0": 2e-4, "lrf": 0.01, "momentum": 0.9, "weight_decay": 0.0,
        "warmup_epochs": 0.0, "warmup_bias_lr": 0.0, "cos_lr": True,
    }

    def __init__(self, net: nn.Module, *, nc: int = 1, names: Any = None, **kwargs: Any):
        # one output "class" whatever a caller's generic default says
        super().__init__(net, nc=1, names=names if names is not None else {0: "image"}, **kwargs)

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        return {0: "image"}

    @classmethod
    def nc_from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> int | None:
        return 1

    @classmethod
    def scale_of(cls, size: str) -> int:
        """Output pixels per input pixel of ``size``."""
        return int(cls.SCALE_BY_SIZE.get(size, 1))

    @property
    def scale(self) -> int:
        """Output pixels per input pixel (1: restoration at the same size; 2, 4: super-resolution)."""
        return self.scale_of(self.size)

    #: LibreYOLO 1.6.0's name of :attr:`scale`
    restore_scale = scale

    def train_defaults(self) -> dict[str, Any]:
        return {**self.TRAIN_DEFAULTS, "imgsz": self.imgsz}

    def train(self, **kwargs: Any) -> dict:
        """Train as :meth:`Model.train`; ``nbs`` defaults to ``batch`` (the loss is a per-pixel mean)."""
        if kwargs.get("nbs") is None:
            from ...engine.config import RunConfig
            batch = kwargs.get("batch")
            kwargs["nbs"] = int(batch if batch is not None else RunConfig.batch)
        return super().train(**kwargs)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) RGB in [0, 1] -> float32 restored RGB (B, 3, scale*H, scale*W), not clamped."""
        return self.model(x).float()
